"""Development tokens for `make run` on the embedded database, so a first curl just works."""

import asyncio
import json
from pathlib import Path

import typer

from db import tokens
from db.engine import create_engine

DEV_SUBJECTS = {"admin": "admin", "reviewer": "reviewer", "approver": "approver"}


def _saved(path: Path) -> dict[str, str]:
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in saved.items() if isinstance(k, str) and isinstance(v, str)}


async def _valid_tokens(url: str, saved: dict[str, str]) -> dict[str, str]:
    """The saved tokens the database still accepts; a new one for each role that was revoked,
    expired or never stored, so that what `make run` prints always works."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.begin() as conn:
            valid: dict[str, str] = {}
            for role, subject in DEV_SUBJECTS.items():
                token = saved.get(role, "")
                principal = await tokens.find_principal(conn, token=token) if token else None
                if principal != tokens.Principal(subject, role):
                    token = await tokens.create_token(conn, subject=subject, role=role)
                valid[role] = token
            return valid
    finally:
        await engine.dispose()


def ensure_and_print(url: str, data_dir: Path, host: str, port: int) -> dict[str, str]:
    # Only hashes live in the database, so the clear tokens are kept beside the embedded data
    # (git-ignored, this machine only, mode 0600) to print them again on every start.
    path = data_dir / "dev-tokens.json"
    saved = _saved(path)
    valid = asyncio.run(_valid_tokens(url, saved))
    if valid != saved or not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(json.dumps(valid))
        if saved:
            typer.echo("A development token was revoked, expired or missing: created a new one.")
    path.chmod(0o600)
    typer.echo(instructions(valid, f"http://{host}:{port}", path))
    return valid


def instructions(saved: dict[str, str], base: str, path: Path) -> str:
    """What `make run` prints: the tokens, a first curl, and where the reviewer desk is."""
    lines = [f"Development tokens (embedded database only; kept in plain text in {path}):"]
    lines += [f"  {role:<9} {token}" for role, token in saved.items()]
    lines += [
        "Try:",
        f"  export RQ_ADMIN={saved['admin']} RQ_REVIEWER={saved['reviewer']}"
        + (f" RQ_APPROVER={saved['approver']}" if "approver" in saved else ""),
        f'  curl -s -X POST {base}/leases -H "Authorization: Bearer $RQ_REVIEWER"',
        f"Reviewer desk: {base}/desk/  (sign in with the reviewer or admin token above)",
    ]
    return "\n".join(lines)
