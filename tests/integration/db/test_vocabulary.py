"""The contract's vocabulary in db/vocabulary.py is the one the migrated database enforces: each tuple
equals the values its CHECK constraint allows, read back from pg_constraint (the migrations own
the constraints; a value added to one side only fails here)."""

import re

import psycopg
import pytest

from db.vocabulary import EVENTS, MATCH_DECISIONS, ROLES, STATES

VOCABULARIES = [
    ("review_queue_item", "ck_review_queue_item_valid_state", STATES),
    ("review_queue_item", "ck_review_queue_item_valid_match_decision", MATCH_DECISIONS),
    ("review_queue_event", "ck_review_queue_event_valid_event", EVENTS),
    ("api_token", "ck_api_token_valid_role", ROLES),
]


def allowed_values(sql: psycopg.Connection, table: str, constraint: str) -> list[str]:
    """The string literals of the CHECK as PostgreSQL stores it (`x = ANY (ARRAY['A'::text, ...])`)."""
    row = sql.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND conname = %s AND contype = 'c'",
        (table, constraint),
    ).fetchone()
    assert row is not None, f"no CHECK {constraint} on {table} in the migrated database"
    definition: str = row[0]
    return [value.replace("''", "'") for value in re.findall(r"'((?:[^']|'')*)'", definition)]


@pytest.mark.parametrize(
    ("table", "constraint", "vocabulary"), VOCABULARIES, ids=[v[1] for v in VOCABULARIES]
)
def test_the_vocabulary_equals_its_check_constraint(
    sql: psycopg.Connection, table: str, constraint: str, vocabulary: tuple[str, ...]
) -> None:
    allowed = allowed_values(sql, table, constraint)
    assert len(set(vocabulary)) == len(vocabulary), (
        f"{constraint}: a value twice in db/vocabulary.py: {vocabulary}"
    )
    assert sorted(allowed) == sorted(vocabulary), (
        f"{constraint}: only in the database {sorted(set(allowed) - set(vocabulary))}, "
        f"only in db/vocabulary.py {sorted(set(vocabulary) - set(allowed))}"
    )
