"""Search that finds (issue 42): `GET /items?q=` matches, case-insensitively, a prefix of the id,
the idempotency key, the ledger entity or any string or number in `context`, nested too.

- `review_queue_item_search_prefixes(idempotency_key, ledger_entity, context)`: every prefix, up
  to 32 characters, of each of those values, lower-cased. A term is then one array element to
  look up (`@> ARRAY[term]`): no pattern, no wildcard. IMMUTABLE (it reads only its arguments), so
  that an index can hold it.
- `ix_review_queue_item_search`: a GIN index of those prefixes. A term's posting list holds
  exactly the items that match (a term over 32 characters: those whose first 32 match, rechecked
  by the next function), so a search reads what it finds, whatever the history's size. A trigram
  index (pg_trgm) was tried first and measured: every invoice number shares INV's trigrams, and
  their posting lists grow with the history (x3.3 of an empty history's time at 1M items, bench
  part 9); this one does not.
- `review_queue_item_search_text(...)`: the same values, lower-cased, each after a unit separator
  (U+001F), for the exact check of a term longer than 32 characters (`%<US>term%`, its LIKE
  wildcards escaped), on the rows the index found.
  None of the three columns changes after enqueue, so leases and completions stay HOT updates and
  never write to the index.

Online: the functions under the migration's transaction (nothing is locked but the catalogue); the
index built CONCURRENTLY outside it (Alembic's autocommit block), writers going on meanwhile, then
ANALYZE, which gathers the statistics of the indexed expression that the planner estimates a
term's rows from (a rare term: read the index; a common one: walk the list order). Should the build
fail (a rare deadlock), the invalid index is left: drop it and run the migration again.

Revision ID: 5a9c3e7b2d18
Revises: 7b2e4d9c1f30
Create Date: 2026-12-07 01:20:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "5a9c3e7b2d18"
down_revision: str | None = "7b2e4d9c1f30"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Not DISTINCT: GIN keeps each key of an item once anyway, and a list walk that filters by this
# evaluates it on every row it passes (a third faster without the sort).
# Strings and numbers at any depth (an invoice number may sit in a list of invoices, or under a
# counterparty); not booleans or nulls (`t` would find every item with a true flag), not keys.
VALUES = """
SELECT lower(v #>> '{}')
FROM jsonb_path_query(context, 'strict $.** ? (@.type() == "string" || @.type() == "number")') AS v
"""
PREFIXES = f"""
CREATE OR REPLACE FUNCTION review_queue_item_search_prefixes(
    idempotency_key text, ledger_entity text, context jsonb
) RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(
    SELECT left(v, n)
    FROM unnest(ARRAY[lower(idempotency_key), lower(ledger_entity)] || ARRAY({VALUES})) AS v,
         generate_series(1, least(length(v), 32)) AS n
)
"""
TEXT = rf"""
CREATE OR REPLACE FUNCTION review_queue_item_search_text(
    idempotency_key text, ledger_entity text, context jsonb
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN E'\x1f' || lower(idempotency_key) || E'\x1f' || lower(ledger_entity) || E'\x1f'
    || coalesce(array_to_string(ARRAY({VALUES}), E'\x1f'), '')
"""
INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_review_queue_item_search ON review_queue_item"
    " USING gin (review_queue_item_search_prefixes(idempotency_key, ledger_entity, context))"
)


def upgrade() -> None:
    op.execute(PREFIXES)
    op.execute(TEXT)
    with op.get_context().autocommit_block():
        op.execute(INDEX)
        # The planner estimates a term's rows from the most common prefixes ANALYZE keeps (ten times
        # the statistics target); one it did not keep counts as half the rarest kept. At the default
        # 100, the rarest kept is common (every `inv-7`...), so a rare invoice number looked like
        # 0.5 % of the items and the list order was walked for it (52 s at 1M items, bench part 9).
        op.execute("ALTER INDEX ix_review_queue_item_search ALTER COLUMN 1 SET STATISTICS 2000")
        op.execute("ANALYZE review_queue_item")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_review_queue_item_search")
    op.execute("DROP FUNCTION IF EXISTS review_queue_item_search_prefixes(text, text, jsonb)")
    op.execute("DROP FUNCTION IF EXISTS review_queue_item_search_text(text, text, jsonb)")
