"""What every table module builds on: the one `metadata` (and its naming convention) and the
PostgreSQL types SQLAlchemy does not have."""

from sqlalchemy import MetaData
from sqlalchemy.dialects.postgresql.base import ischema_names
from sqlalchemy.types import UserDefinedType


class Xid8(UserDefinedType[str]):
    """PostgreSQL's 64-bit transaction id (`pg_current_xact_id()`), read and written as text."""

    cache_ok = True

    def get_col_spec(self, **_: object) -> str:
        return "xid8"


class PgSnapshot(UserDefinedType[str]):
    """PostgreSQL's `pg_snapshot` (`pg_current_snapshot()`): which transactions a count saw."""

    cache_ok = True

    def get_col_spec(self, **_: object) -> str:
        return "pg_snapshot"


# Reflection (alembic check) knows the types by name, instead of warning and skipping them.
ischema_names["xid8"] = Xid8
ischema_names["pg_snapshot"] = PgSnapshot


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)
