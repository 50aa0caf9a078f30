"""Alembic runs on a plain synchronous psycopg connection to the service's database."""

from logging.config import fileConfig

from sqlalchemy import create_engine, pool

from alembic import context
from api.settings import get_settings
from db.engine import migration_url
from db.reports import tables as _report_tables  # noqa: F401 - its tables join `metadata`
from db.tables import metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


if "app_role" not in config.attributes:
    config.attributes["app_role"] = get_settings().app_role


def _url() -> str:
    # Tests and the CLI pass the URL explicitly; a bare `alembic` call resolves it like the app.
    explicit = config.get_main_option("sqlalchemy.url")
    if explicit:
        return explicit
    settings = get_settings()
    return migration_url(settings.migration_database_url, settings.database_url, settings.data_dir)


# The event trail's partitions (review_queue_event_legacy, review_queue_event_YYYY_MM) are made by
# the migration and by review_queue_event_add_months(), not by db/tables/: the model is the parent.
def _modelled(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    return not (type_ == "table" and reflected and (name or "").startswith("review_queue_event_"))


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True, include_object=_modelled)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # A bounded connect: an unreachable host fails in seconds with a message, not after minutes.
    engine = create_engine(_url(), poolclass=pool.NullPool, connect_args={"connect_timeout": 10})
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=metadata, compare_type=True, include_object=_modelled
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
