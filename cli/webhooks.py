"""`review-queue webhooks`: the deliverer's key for secrets at rest."""

import typer

webhooks_app = typer.Typer(
    no_args_is_help=True, help="Webhooks: the deliverer's key for secrets at rest.", rich_markup_mode=None
)


@webhooks_app.command("key")
def webhooks_key() -> None:
    """Print a new Fernet key for REVIEW_QUEUE_WEBHOOK_KEY.

    To rotate, put the new key before the old one (comma-separated)."""
    from cryptography.fernet import Fernet

    typer.echo(Fernet.generate_key().decode())
