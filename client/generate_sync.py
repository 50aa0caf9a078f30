"""Generate client/sync.py from client/aio.py: unasync (as httpcore does) drops `async` and `await` and
renames the async names to their sync twins, then ruff tidies what the renaming leaves (import order,
a `for ... yield` that can be `yield from`) and formats it. A development tool: not in the wheel.

    python -m client.generate_sync          # write client/sync.py
    python -m client.generate_sync --check  # exit 1 if client/sync.py is not what generation gives
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "aio.py"
TARGET = HERE / "sync.py"

# Beyond unasync's own (__aenter__ to __enter__, AsyncIterator to Iterator, ...): httpx's names, and
# each primitive of client/concurrency.py and client/work.py to its twin. Without an entry here,
# unasync would rename AsyncX to SyncX.
RENAMES = {
    "AsyncClient": "Client",
    "aclose": "close",
    "aread": "read",
    "aiter_lines": "iter_lines",
    "AsyncReviewQueueClient": "ReviewQueueClient",
    "AsyncHandler": "Handler",
    "AsyncStop": "Stop",
    "async_sleep": "sleep",
    "async_repeat": "repeat",
    "async_stop_on_signals": "stop_on_signals",
}

HEADER = """\
# GENERATED from client/aio.py by client/generate_sync.py (unasync, then ruff): do not edit.
# Change client/aio.py, then run `uv run python -m client.generate_sync`; `make lint` fails while
# this file differs from what that gives.
"""


def _unasync(source: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        written = Path(tmp, "_async", "aio.py")
        written.parent.mkdir()
        written.write_text(source)
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=RENAMES)
        unasync.unasync_files([str(written)], [rule])
        return Path(tmp, "_sync", "aio.py").read_text()


def _ruff(*args: str, source: str) -> str:
    # The project's ruff and settings (pyproject.toml), on the text as if it were client/sync.py.
    command = [sys.executable, "-m", "ruff", *args, "--quiet", "--stdin-filename", str(TARGET), "-"]
    done = subprocess.run(  # noqa: S603 - our own interpreter's ruff, fixed arguments
        command, input=source, capture_output=True, text=True, cwd=HERE.parent, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed on the generated client:\n{done.stderr}")
    return done.stdout


def generate() -> str:
    """What client/sync.py must hold."""
    text = HEADER + _unasync(SOURCE.read_text())
    text = _ruff("check", "--fix", "--exit-zero", source=text)
    # An async generator cannot `yield from`; for a list, the sync one's `yield from` is the same
    # loop (ruff calls the fix unsafe only because a generator's send() would be delegated).
    text = _ruff("check", "--select", "UP028", "--fix", "--unsafe-fixes", "--exit-zero", source=text)
    return _ruff("format", source=text)


def stale(target: Path = TARGET) -> bool:
    return target.read_text() != generate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only check that client/sync.py is current")
    if parser.parse_args(argv).check:
        if stale():
            print("client/sync.py is stale: run `uv run python -m client.generate_sync`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(generate())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
