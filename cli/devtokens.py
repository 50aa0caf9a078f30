"""Development tokens for `make run` on the embedded database, so a first curl just works."""

import asyncio
import json

import typer

from api.settings import Settings
from db import tokens
from db.engine import create_engine, database_url

DEV_SUBJECTS = {"admin": "admin", "reviewer": "reviewer"}


async def _create_if_empty(url: str) -> dict[str, str] | None:
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.begin() as conn:
            if await tokens.any_token_exists(conn):
                return None
            return {
                role: await tokens.create_token(conn, subject=subject, role=role)
                for role, subject in DEV_SUBJECTS.items()
            }
    finally:
        await engine.dispose()


def ensure_and_print(settings: Settings, host: str, port: int) -> None:
    # Only hashes live in the database, so the clear tokens are kept beside the embedded
    # data (git-ignored, this machine only) to print them again on every start.
    path = settings.data_dir / "dev-tokens.json"
    created = asyncio.run(_create_if_empty(database_url(None, settings.data_dir)))
    if created is not None:
        path.write_text(json.dumps(created))
        path.chmod(0o600)
    if not path.exists():
        return
    saved: dict[str, str] = json.loads(path.read_text())
    typer.echo(instructions(saved, f"http://{host}:{port}"))


def instructions(saved: dict[str, str], base: str) -> str:
    """What `make run` prints: the tokens, a first curl, and where the reviewer desk is."""
    lines = ["Development tokens (embedded database only):"]
    lines += [f"  {role:<9} {token}" for role, token in saved.items()]
    lines += [
        "Try:",
        f"  export RQ_ADMIN={saved['admin']} RQ_REVIEWER={saved['reviewer']}",
        f'  curl -s -X POST {base}/leases -H "Authorization: Bearer $RQ_REVIEWER"',
        f"Reviewer desk: {base}/desk/  (sign in with the reviewer or admin token above)",
    ]
    return "\n".join(lines)
