"""The service's role gets rows, not tables: least privilege for the application role.

Revision ID: 3e8a1d5c7b42
Revises: 7c2f4e1a9d03
Create Date: 2026-12-03 09:00:00+00:00

Runs as the schema owner. Grants the application role (REVIEW_QUEUE_APP_ROLE, default
review_queue_app) what the service does and nothing more: read and write items and tokens,
read and append events. No UPDATE, DELETE or TRUNCATE on events, no DELETE on items, no DDL
(only an owner can ALTER a table or disable its trigger). Tables added by later migrations get
SELECT, INSERT, UPDATE, DELETE by default privileges; a migration that needs less revokes it.
Where the role does not exist (one role for everything), nothing is granted and the service
warns at start-up that it runs as the owner.
"""

from collections.abc import Sequence

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "3e8a1d5c7b42"
down_revision: str | None = "7c2f4e1a9d03"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_GRANTS = """
GRANT USAGE ON SCHEMA public TO {role};
GRANT SELECT ON alembic_version TO {role};
GRANT SELECT, INSERT, UPDATE ON review_queue_item, api_token TO {role};
GRANT SELECT, INSERT ON review_queue_event TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {role};
"""
_REVOKES = """
ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE USAGE, SELECT ON SEQUENCES FROM {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT, INSERT, UPDATE, DELETE ON TABLES FROM {role};
REVOKE ALL ON review_queue_event, review_queue_item, api_token, alembic_version FROM {role};
REVOKE USAGE ON SCHEMA public FROM {role};
"""


def _for_app_role(statements: str) -> None:
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted = '"' + role.replace('"', '""') + '"'
    literal = role.replace("'", "''")
    executes = "\n".join(
        f"EXECUTE '{line.format(role=quoted).replace(chr(39), chr(39) * 2)}';"
        for line in statements.strip().splitlines()
    )
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN
                {executes}
            ELSE
                RAISE NOTICE 'role % does not exist: nothing granted', '{literal}';
            END IF;
        END
        $$
        """
    )


def upgrade() -> None:
    _for_app_role(_GRANTS)


def downgrade() -> None:
    _for_app_role(_REVOKES)
