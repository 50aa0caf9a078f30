"""Search that finds (issue 42): `GET /items?q=` matches, case-insensitively, a prefix of the id,
the idempotency key, the ledger entity or any string or number in `context`, nested too.

- `pg_trgm` (a contrib extension, trusted since PostgreSQL 13: the database's owner may create it
  without being a superuser). Embedded PostgreSQL ships it, and so does Debian's `postgresql-15`
  package; a managed server may need it allowed first (docs/production.md).
- `review_queue_item_search_text(idempotency_key, ledger_entity, context)`: those values, lower-
  cased, each after a unit separator (U+001F), so that "a prefix of a value" is the substring
  pattern `%<US>term%`. IMMUTABLE (it reads only its arguments), so that an index can hold it.
- `ix_review_queue_item_search`: a GIN trigram index of that text, which the pattern reads
  whatever the term's length (pg_trgm takes a term right after a non-word character as the start
  of a word). The id is not in it: a prefix of an id is a range of the primary key (db/queue/reads.py).
  None of the three columns changes after enqueue, so leases and completions stay HOT updates
  and never write to it.

Online: the function under the migration's transaction (nothing is locked but the catalogue); the
index built CONCURRENTLY outside it (Alembic's autocommit block), writers going on meanwhile, then
ANALYZE, which gathers the statistics of the indexed expression that the planner estimates a
term's rows from (without them it guesses, and may walk the whole list order for a rare term).
Should the build fail (a rare deadlock), the invalid index is left: drop it and run the migration
again.

Revision ID: 5a9c3e7b2d18
Revises: 4f8b2d6e9a15
Create Date: 2026-12-07 00:50:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "5a9c3e7b2d18"
down_revision: str | None = "4f8b2d6e9a15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Strings and numbers at any depth (an invoice number may sit in a list of invoices, or under a
# counterparty); not booleans or nulls (`t` would find every item with a true flag), not keys.
FUNCTION = r"""
CREATE OR REPLACE FUNCTION review_queue_item_search_text(
    idempotency_key text, ledger_entity text, context jsonb
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN lower(
    E'\x1f' || idempotency_key || E'\x1f' || ledger_entity || E'\x1f' || coalesce((
        SELECT string_agg(v #>> '{}', E'\x1f')
        FROM jsonb_path_query(context, 'strict $.** ? (@.type() == "string" || @.type() == "number")') AS v
    ), '')
)
"""
INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_review_queue_item_search ON review_queue_item"
    " USING gin (review_queue_item_search_text(idempotency_key, ledger_entity, context) gin_trgm_ops)"
)


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    op.execute(FUNCTION)
    with op.get_context().autocommit_block():
        op.execute(INDEX)
        op.execute("ANALYZE review_queue_item")


def downgrade() -> None:
    # pg_trgm stays: something else in the database may use it, and it changes nothing by being there.
    op.execute("DROP INDEX IF EXISTS ix_review_queue_item_search")
    op.execute("DROP FUNCTION IF EXISTS review_queue_item_search_text(text, text, jsonb)")
