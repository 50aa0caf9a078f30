"""The event trail partitioned by month (issue 29).

`review_queue_event` becomes a table partitioned by RANGE (at). The table as it was becomes its
first partition, `review_queue_event_legacy`, FROM (MINVALUE) TO the first of next month (UTC):
nothing is copied. Months after it get a partition each, `review_queue_event_YYYY_MM`, created
ahead by `review_queue_event_add_months(ahead)`, which the reclaimer calls every round
(REVIEW_QUEUE_EVENT_MONTHS_AHEAD); this migration creates the first ones.

The switch is the procedure prototyped on a year of 3.3M events (docs/capacity.md):
1. a unique index on (id, at) and a CHECK (at < bound), the legacy's partition constraint: the only
   steps that read the table. On a large table, run both by hand beforehand, online:
       CREATE UNIQUE INDEX CONCURRENTLY pk_review_queue_event_legacy ON review_queue_event (id, at);
       ALTER TABLE review_queue_event ADD CONSTRAINT ck_review_queue_event_legacy_at
           CHECK (at < '<first of next month>+00') NOT VALID;
       ALTER TABLE review_queue_event VALIDATE CONSTRAINT ck_review_queue_event_legacy_at;
   The migration finds them (and takes the bound from the constraint) and reads nothing. The CHECK
   refuses every event from its bound on: migrate before then (the same day), and make the bound
   the first of a month in UTC, which is where review_queue_event_add_months starts;
2. catalogue changes only, under one lock: rename, make the index the legacy's primary key, create
   the partitioned parent with the same columns, constraints, identity (after the legacy's last
   id), attach the legacy (its CHECK implies the bound: no scan), and create the parent's indexes,
   which take over the legacy's equal ones rather than build new ones.

What the parent holds for every partition: the row triggers (append-only, the lease start, the
reopened items) are cloned to each partition by PostgreSQL; the TRUNCATE trigger is per table, so
each partition gets its own. Privileges are the parent's: the roles read and write through it. A
partition grants nothing (not even what ALTER DEFAULT PRIVILEGES would give a new table), so no
role can insert a row with a forged id, time or transaction id into a partition directly.

Revision ID: 5c1e9f3a7d20
Revises: 8b2e6d4a9c31
Create Date: 2026-12-05 02:00:00+00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa

from alembic import context, op
from db.migrations import MigrationRefused
from db.roles import APP_ROLE

revision: str = "5c1e9f3a7d20"
down_revision: str | None = "8b2e6d4a9c31"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MONTHS_AHEAD = 3  # created here; the reclaimer keeps REVIEW_QUEUE_EVENT_MONTHS_AHEAD from then on

COLUMNS = """
    id bigint GENERATED ALWAYS AS IDENTITY (START WITH {start}),
    item_id uuid NOT NULL,
    event text NOT NULL,
    actor text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    lease_epoch bigint NOT NULL,
    trace_id uuid NOT NULL,
    details jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    leased_at timestamptz,
    CONSTRAINT fk_review_queue_event_item_id_review_queue_item
        FOREIGN KEY (item_id) REFERENCES review_queue_item (id)"""

# Owner-run (SECURITY DEFINER): the reclaimer, as the application role, may only ask for the months
# to exist. Each month: a new table, then ATTACH, which takes SHARE UPDATE EXCLUSIVE on the parent
# (inserts and reads go on; CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE). Attaching
# clones the foreign key, which locks review_queue_item briefly (SHARE ROW EXCLUSIVE): under a
# short lock_timeout a busy moment fails the call, and the next round tries again.
ADD_MONTHS = r"""
CREATE FUNCTION review_queue_event_add_months(ahead integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET TimeZone = 'UTC'
SET lock_timeout = '500ms'
AS $$
DECLARE
    legacy_end timestamptz;
    lo timestamptz;
    name text;
    grantee regrole;
    made integer := 0;
BEGIN
    SELECT CAST((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1] AS timestamptz)
    INTO legacy_end
    FROM pg_class c WHERE c.oid = 'public.review_queue_event_legacy'::regclass;
    -- At most two years: the caller may be the application role.
    FOR k IN 0 .. least(greatest(ahead, 0), 24) LOOP
        lo := date_trunc('month', now()) + make_interval(months => k);
        CONTINUE WHEN lo < legacy_end;
        name := 'review_queue_event_' || to_char(lo, 'YYYY_MM');
        CONTINUE WHEN to_regclass('public.' || name) IS NOT NULL;
        EXECUTE format('CREATE TABLE public.%I (LIKE public.review_queue_event'
                       ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        FOR grantee IN
            SELECT DISTINCT a.grantee::regrole FROM pg_class c, aclexplode(c.relacl) AS a
            WHERE c.oid = to_regclass('public.' || name) AND a.grantee <> c.relowner AND a.grantee <> 0
        LOOP
            EXECUTE format('REVOKE ALL ON public.%I FROM %s', name, grantee);
        END LOOP;
        EXECUTE format('REVOKE ALL ON public.%I FROM PUBLIC', name);
        EXECUTE format(
            'CREATE TRIGGER review_queue_event_no_truncate BEFORE TRUNCATE ON public.%I'
            ' FOR EACH STATEMENT EXECUTE FUNCTION public.review_queue_event_append_only()', name);
        EXECUTE format(
            'ALTER TABLE public.review_queue_event ATTACH PARTITION public.%I FOR VALUES FROM (%L) TO (%L)',
            name, lo, lo + interval '1 month');
        made := made + 1;
    END LOOP;
    RETURN made;
END
$$
"""


def _grants(table: str) -> list[tuple[str, str, str | None]]:
    """(grantee, privilege, column or None) of every role but the owner, on `table`."""
    rows = op.get_bind().execute(
        sa.text("""
        SELECT a.grantee::regrole::text, a.privilege_type, NULL AS col
        FROM pg_class c, aclexplode(c.relacl) AS a
        WHERE c.oid = CAST(:t AS regclass) AND a.grantee <> c.relowner AND a.grantee <> 0
        UNION ALL
        SELECT a.grantee::regrole::text, a.privilege_type, quote_ident(t.attname)
        FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid, aclexplode(t.attacl) AS a
        WHERE t.attrelid = CAST(:t AS regclass) AND a.grantee <> c.relowner AND a.grantee <> 0
        ORDER BY 1, 2, 3
        """),
        {"t": table},
    )
    return [(r[0], r[1], r[2]) for r in rows]


def _move_grants(source: str, target: str) -> None:
    """`target` gets exactly `source`'s grants (not what ALTER DEFAULT PRIVILEGES gave it as a new
    table), and `source` none."""
    for grantee in sorted({g for g, _, _ in _grants(target)}):
        op.execute(f"REVOKE ALL ON {target} FROM {grantee}")
    grants = _grants(source)
    for grantee, privilege, column in grants:
        columns = f" ({column})" if column else ""
        op.execute(f"GRANT {privilege}{columns} ON {target} TO {grantee}")
    for grantee in sorted({g for g, _, _ in grants}):
        op.execute(f"REVOKE ALL ON {source} FROM {grantee}")


def _definitions(query: str) -> list[str]:
    return [r[0] for r in op.get_bind().execute(sa.text(query))]


# Of the table named review_queue_event when called: its row triggers and secondary indexes.
_ROW_TRIGGERS = """
SELECT pg_get_triggerdef(oid) FROM pg_trigger
WHERE tgrelid = 'review_queue_event'::regclass AND NOT tgisinternal AND tgtype & 1 = 1
  AND tgparentid = 0 ORDER BY tgname
"""
_INDEXES = """
SELECT replace(pg_get_indexdef(i.indexrelid), ' ON ONLY ', ' ON ') FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'review_queue_event'::regclass AND NOT i.indisprimary
  AND c.relname <> 'pk_review_queue_event_legacy' ORDER BY c.relname
"""
_INDEX_NAMES = """
SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'review_queue_event'::regclass ORDER BY c.relname
"""
# The next id: after the identity's last value and after the last row (a sequence never called has
# no last value, and a row may have been inserted OVERRIDING SYSTEM VALUE); max(id) is the end of
# the primary key's index (one per partition).
_NEXT_ID = """
SELECT greatest(
    coalesce(pg_sequence_last_value(CAST(pg_get_serial_sequence('review_queue_event', 'id') AS regclass)), 0),
    (SELECT coalesce(max(id), 0) FROM review_queue_event)
) + 1
"""
_ROW_TRIGGER_NAMES = """
SELECT tgname FROM pg_trigger
WHERE tgrelid = 'review_queue_event'::regclass AND NOT tgisinternal AND tgtype & 1 = 1 AND tgparentid = 0
"""


def _recreate(indexes: list[str], triggers: list[str]) -> None:
    """On the (new) review_queue_event: the indexes and row triggers read from the one before it,
    and the TRUNCATE trigger, which is per table (a partition's own is made with it)."""
    for definition in indexes + triggers:
        op.execute(definition)
    op.execute(
        "CREATE TRIGGER review_queue_event_no_truncate BEFORE TRUNCATE ON review_queue_event"
        " FOR EACH STATEMENT EXECUTE FUNCTION review_queue_event_append_only()"
    )


def _legacy_bound() -> datetime:
    """The legacy partition's upper bound: a hand-made CHECK's (step 1 run online beforehand), else
    the first of next month in UTC. A hand-made one must be validated (else attaching would read the
    whole table under the lock) and the first of a month in UTC (else the rest of its month would
    have no partition: review_queue_event_add_months starts at months' firsts)."""
    bind = op.get_bind()
    made = bind.execute(
        sa.text("""
        SELECT CAST((regexp_match(pg_get_constraintdef(oid), '''([^'']+)'''))[1] AS timestamptz),
               convalidated
        FROM pg_constraint WHERE conname = 'ck_review_queue_event_legacy_at'
        """)
    ).one_or_none()
    if made is not None:
        bound, validated = made
        if not validated:
            raise MigrationRefused(
                "ck_review_queue_event_legacy_at is NOT VALID: run ALTER TABLE review_queue_event"
                " VALIDATE CONSTRAINT ck_review_queue_event_legacy_at first (online)"
            )
        start = bound.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        if bound != start:
            raise MigrationRefused(
                f"ck_review_queue_event_legacy_at's bound {bound} is not the first of a month in UTC"
                " (YYYY-MM-01 00:00:00+00), where the monthly partitions start: drop the constraint"
                " and run step 1 again with such a bound"
            )
        return bound  # type: ignore[no-any-return]
    return bind.scalar(  # type: ignore[no-any-return]
        sa.text(
            "SELECT (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'"
        )
    )


def upgrade() -> None:
    bind = op.get_bind()
    bound = _legacy_bound()
    # Step 1 (a no-op when run by hand beforehand).
    op.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS pk_review_queue_event_legacy ON review_queue_event (id, at)"
    )
    if not bind.scalar(
        sa.text("SELECT 1 FROM pg_constraint WHERE conname = 'ck_review_queue_event_legacy_at'")
    ):
        bind.execute(
            sa.text(
                "ALTER TABLE review_queue_event ADD CONSTRAINT ck_review_queue_event_legacy_at"
                f" CHECK (at < '{bound.isoformat()}')"
            )
        )
    # Step 2: catalogue changes, under the lock every following statement would take anyway.
    op.execute("LOCK TABLE review_queue_event IN ACCESS EXCLUSIVE MODE")
    triggers = _definitions(_ROW_TRIGGERS)
    indexes = _definitions(_INDEXES)
    start = bind.scalar(sa.text(_NEXT_ID))
    for name in _definitions(_ROW_TRIGGER_NAMES):
        op.execute(f"DROP TRIGGER {name} ON review_queue_event")
    for name in _definitions(_INDEX_NAMES):
        if name not in ("pk_review_queue_event", "pk_review_queue_event_legacy"):
            op.execute(f"ALTER INDEX {name} RENAME TO {name}_legacy")
    op.execute("ALTER TABLE review_queue_event RENAME TO review_queue_event_legacy")
    op.execute("ALTER TABLE review_queue_event_legacy ALTER COLUMN id DROP IDENTITY")
    op.execute("ALTER TABLE review_queue_event_legacy DROP CONSTRAINT pk_review_queue_event")
    op.execute(
        "ALTER TABLE review_queue_event_legacy ADD CONSTRAINT pk_review_queue_event_legacy"
        " PRIMARY KEY USING INDEX pk_review_queue_event_legacy"
    )
    op.execute(
        "ALTER TABLE review_queue_event_legacy RENAME CONSTRAINT"
        " fk_review_queue_event_item_id_review_queue_item TO fk_review_queue_event_legacy_item_id"
    )
    check = bind.scalar(
        sa.text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'ck_review_queue_event_valid_event'"
        )
    )
    op.execute(
        f"CREATE TABLE review_queue_event ({COLUMNS.format(start=start)},"
        f"\n    CONSTRAINT ck_review_queue_event_valid_event {check},"
        "\n    CONSTRAINT pk_review_queue_event PRIMARY KEY (id, at)"
        "\n) PARTITION BY RANGE (at)"
    )
    op.execute(
        "ALTER TABLE review_queue_event ATTACH PARTITION review_queue_event_legacy"
        f" FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')"
    )
    _recreate(indexes, triggers)
    _move_grants("review_queue_event_legacy", "review_queue_event")
    op.execute(ADD_MONTHS)
    op.execute("REVOKE EXECUTE ON FUNCTION review_queue_event_add_months(integer) FROM PUBLIC")
    app_role = context.config.attributes.get("app_role", APP_ROLE)
    if bind.scalar(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": app_role}):
        op.execute(f'GRANT EXECUTE ON FUNCTION review_queue_event_add_months(integer) TO "{app_role}"')
    op.execute(f"SELECT review_queue_event_add_months({MONTHS_AHEAD})")


def downgrade() -> None:
    bind = op.get_bind()
    op.execute("LOCK TABLE review_queue_event IN ACCESS EXCLUSIVE MODE")
    triggers = _definitions(_ROW_TRIGGERS)
    indexes = _definitions(_INDEXES)
    start = bind.scalar(sa.text(_NEXT_ID))
    op.execute("DROP FUNCTION review_queue_event_add_months(integer)")
    op.execute(
        "CREATE TABLE review_queue_event_plain"
        " (LIKE review_queue_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    op.execute("INSERT INTO review_queue_event_plain SELECT * FROM review_queue_event")
    _move_grants("review_queue_event", "review_queue_event_plain")
    op.execute("DROP TABLE review_queue_event")
    op.execute("ALTER TABLE review_queue_event_plain RENAME TO review_queue_event")
    op.execute("ALTER TABLE review_queue_event ADD CONSTRAINT pk_review_queue_event PRIMARY KEY (id)")
    op.execute(
        "ALTER TABLE review_queue_event ADD CONSTRAINT fk_review_queue_event_item_id_review_queue_item"
        " FOREIGN KEY (item_id) REFERENCES review_queue_item (id)"
    )
    op.execute(
        "ALTER TABLE review_queue_event ALTER COLUMN id"
        f" ADD GENERATED ALWAYS AS IDENTITY (START WITH {start})"
    )
    _recreate(indexes, triggers)
