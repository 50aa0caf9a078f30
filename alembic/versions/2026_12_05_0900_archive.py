"""Archive: the chain's oldest range moves to files, and the live chain starts where they end (issue 29).

`review-queue archive --before <month>` (cli/archive.py, db/archive.py) writes the chain's events
up to the last one before the cutoff, and the resolved items that have no later event, to NDJSON
files, verifies them, and then calls `review_queue_archive_apply`, which in one transaction:
- re-checks what the files were built on: the chain's hash at their last seq, every event before the
  cutoff inside the range, and no item that is not RESOLVED with an event in it;
- deletes the range's events that sit in later partitions (a transaction that began before midnight
  at the month's end and was chained among the new month's) or in the legacy partition when the
  cutoff falls inside it, and the range's chain rows;
- records the range in `review_queue_archive`: its last seq, hash and event's (xid, id) are where
  the live chain now starts (`audit verify`, the sealer);
- drops the month partitions wholly before the cutoff, last: a drop locks the whole trail until
  the commit.
Anything that does not hold raises, and nothing is deleted. The items go afterwards, in batches of
their own (db/archive.py delete_items): deleting an item checks its foreign key against every
partition of the trail, which would otherwise happen under that lock.

The append-only triggers of the events and the chain let a DELETE through only where the
transaction set `review_queue.archiving` (the function does, for its own transaction). The
application role has no DELETE right on either table, so the setting gives it nothing; the schema
owner could always drop the triggers, so this is a guard against accidents, as the triggers are.

Also here, found by review: `review_queue_event_add_months` takes an advisory lock, so two
reclaimers at once do not both create the same month (the second got 42P07 and lost its round),
and it no longer needs the legacy partition to exist (an archive may drop it).

Revision ID: 7d3a1c9e5b42
Revises: 5c1e9f3a7d20
Create Date: 2026-12-05 09:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.migrations import MigrationRefused, earlier_revision
from db.roles import APP_ROLE, SEALER_ROLE

revision: str = "7d3a1c9e5b42"
down_revision: str | None = "5c1e9f3a7d20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_APPEND_ONLY = r"""
CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- review_queue_archive_apply sets this for its own transaction; no other role may DELETE.
    IF TG_OP = 'DELETE' AND current_setting('review_queue.archiving', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '{table} is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$
"""
_APPEND_ONLY_BEFORE = r"""
CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '{table} is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$
"""

_ARCHIVE_TABLE = """
CREATE TABLE review_queue_archive (
    id bigint GENERATED ALWAYS AS IDENTITY CONSTRAINT pk_review_queue_archive PRIMARY KEY,
    cutoff timestamptz NOT NULL,
    first_seq bigint NOT NULL,
    through_seq bigint NOT NULL CONSTRAINT uq_review_queue_archive_through_seq UNIQUE,
    through_hash bytea NOT NULL,
    through_xid xid8 NOT NULL,
    through_event_id bigint NOT NULL,
    events bigint NOT NULL,
    items bigint NOT NULL,
    events_sha256 text NOT NULL,
    items_sha256 text NOT NULL,
    archived_by text NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ck_review_queue_archive_range CHECK (first_seq >= 1 AND through_seq >= first_seq),
    CONSTRAINT ck_review_queue_archive_sha256 CHECK (length(through_hash) = 32)
)
"""

# The owner runs it (review-queue archive connects as the schema owner); not SECURITY DEFINER, and
# no role but the owner may execute it.
_APPLY = r"""
CREATE FUNCTION review_queue_archive_apply(
    cutoff timestamptz, through_seq bigint, through_hash bytea,
    file_items bigint, events_sha256 text, items_sha256 text, archived_by text
) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, public, pg_temp
SET TimeZone = 'UTC'
SET lock_timeout = '5s'
AS $$
DECLARE
    start_seq bigint := 0;
    mark record;
    part record;
    dropped regclass[] := '{}';
    drop_edge timestamptz;
    blocked uuid;
    removed bigint := 0;
    n bigint;
BEGIN
    -- The sealer's lock: no seal runs while the chain's start moves.
    PERFORM pg_advisory_xact_lock(hashtext('review_queue.chain'));
    SELECT a.through_seq INTO start_seq FROM review_queue_archive a ORDER BY a.through_seq DESC LIMIT 1;
    start_seq := coalesce(start_seq, 0);
    IF through_seq <= start_seq THEN
        RAISE EXCEPTION 'seq % is already archived (the live chain starts after seq %)',
            through_seq, start_seq USING ERRCODE = 'RQ010';
    END IF;
    SELECT c.hash, e.xid, e.id INTO mark
    FROM review_queue_chain c JOIN review_queue_event e ON e.id = c.event_id WHERE c.seq = through_seq;
    IF NOT FOUND OR mark.hash <> through_hash THEN
        RAISE EXCEPTION 'the chain at seq % is not what the file holds', through_seq USING ERRCODE = 'RQ010';
    END IF;
    IF EXISTS (SELECT FROM review_queue_event e
               WHERE e.at < cutoff AND (e.xid, e.id) > (mark.xid, mark.id)) THEN
        RAISE EXCEPTION 'an event before % is not in the range: seal first', cutoff USING ERRCODE = 'RQ010';
    END IF;
    SELECT i.id INTO blocked FROM review_queue_item i
    WHERE i.state <> 'RESOLVED' AND EXISTS (
        SELECT FROM review_queue_event e WHERE e.item_id = i.id AND (e.xid, e.id) <= (mark.xid, mark.id))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'item % is open and has events in the range: nothing open is archived', blocked
            USING ERRCODE = 'RQ010';
    END IF;

    -- The months that end at or before the cutoff hold only the range's events (checked above): they
    -- are dropped whole, last, because dropping a partition locks the whole trail (ACCESS EXCLUSIVE
    -- on the parent) until the commit, and every lease and completion writes an event.
    FOR part IN
        SELECT c.oid::regclass AS name,
               CAST((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]
                    AS timestamptz) AS upper_bound
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.review_queue_event'::regclass
    LOOP
        CONTINUE WHEN part.upper_bound > cutoff;
        -- No row may join it between its count and its drop (only the owner can write an old `at`).
        EXECUTE format('LOCK TABLE %s IN SHARE MODE', part.name);
        EXECUTE format('SELECT count(*) FROM %s', part.name) INTO n;
        removed := removed + n;
        dropped := dropped || part.name;
        drop_edge := greatest(drop_edge, part.upper_bound);
    END LOOP;
    -- The rest of the range, row by row: its few events in later months, or the legacy partition's
    -- while the cutoff falls inside it (the months about to be dropped are left out by their bound).
    PERFORM set_config('review_queue.archiving', 'on', true);
    DELETE FROM review_queue_event e
    WHERE (e.xid, e.id) <= (mark.xid, mark.id) AND (drop_edge IS NULL OR e.at >= drop_edge);
    GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    IF removed <> through_seq - start_seq THEN
        RAISE EXCEPTION 'the range holds % chain entries but % events', through_seq - start_seq, removed
            USING ERRCODE = 'RQ010';
    END IF;
    DELETE FROM review_queue_chain c WHERE c.seq <= through_seq;
    PERFORM set_config('review_queue.archiving', 'off', true);
    INSERT INTO review_queue_archive (cutoff, first_seq, through_seq, through_hash, through_xid,
        through_event_id, events, items, events_sha256, items_sha256, archived_by)
    VALUES (cutoff, start_seq + 1, through_seq, through_hash, mark.xid, mark.id, removed, file_items,
        events_sha256, items_sha256, archived_by);
    FOR k IN 1 .. coalesce(array_length(dropped, 1), 0) LOOP
        EXECUTE format('DROP TABLE %s', dropped[k]);
    END LOOP;
    RETURN removed;
END
$$
"""

# The sealer as in 2026_12_04_0620, but an empty chain after an archive continues from the archive's
# last seq, hash and (xid, id), not from genesis.
_SEAL = r"""
CREATE OR REPLACE FUNCTION review_queue_seal(batch integer) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
    head record;
    seq bigint := 0;
    previous bytea := decode(repeat('00', 32), 'hex');
    mark_xid xid8 := '0';
    mark_id bigint := 0;
    ev record;
    seqs bigint[] := '{}';
    ids bigint[] := '{}';
    hashes bytea[] := '{}';
BEGIN
    IF batch IS NULL OR batch < 1 OR batch > 100000 THEN
        RAISE EXCEPTION 'batch must be 1-100000, not %', batch USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtext('review_queue.chain')) THEN
        RETURN NULL;  -- another sealer is at work
    END IF;
    SELECT c.seq, c.hash, e.xid, e.id INTO head
    FROM review_queue_chain c LEFT JOIN review_queue_event e ON e.id = c.event_id
    ORDER BY c.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        SELECT a.through_seq AS seq, a.through_hash AS hash, a.through_xid AS xid, a.through_event_id AS id
        INTO head FROM review_queue_archive a ORDER BY a.through_seq DESC LIMIT 1;
        IF FOUND THEN
            seq := head.seq;
            previous := head.hash;
            mark_xid := head.xid;
            mark_id := head.id;
        END IF;
    ELSE
        IF head.id IS NULL THEN
            -- Tampering: re-sealing around the hole would hide it.
            RAISE EXCEPTION 'the event sealed at seq % is missing', head.seq USING ERRCODE = 'RQ001';
        END IF;
        seq := head.seq;
        previous := head.hash;
        mark_xid := head.xid;
        mark_id := head.id;
    END IF;
    FOR ev IN
        SELECT e.id, convert_to(
            '{"actor":' || review_queue_json_string(e.actor)
            || ',"at":"' || to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            || '","details":' || CASE WHEN jsonb_typeof(e.details) = 'object'
                THEN review_queue_json_members(e.details) ELSE review_queue_canonical_json(e.details) END
            || ',"event":' || review_queue_json_string(e.event)
            || ',"id":' || e.id
            || ',"item_id":"' || e.item_id::text
            || '","lease_epoch":' || e.lease_epoch
            || ',"trace_id":"' || e.trace_id::text || '"}',
            'UTF8') AS encoded
        FROM review_queue_event e
        WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot()) AND (e.xid, e.id) > (mark_xid, mark_id)
        ORDER BY e.xid, e.id
        LIMIT batch
    LOOP
        previous := sha256(previous || ev.encoded);
        seq := seq + 1;
        seqs := seqs || seq;
        ids := ids || ev.id;
        hashes := hashes || previous;
    END LOOP;
    INSERT INTO review_queue_chain (seq, event_id, hash)
    SELECT * FROM unnest(seqs, ids, hashes);
    RETURN cardinality(seqs);
END
$$
"""

_ADD_MONTHS = r"""
CREATE OR REPLACE FUNCTION review_queue_event_add_months(ahead integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET TimeZone = 'UTC'
SET lock_timeout = '500ms'
AS $$
DECLARE
    legacy regclass := to_regclass('public.review_queue_event_legacy');
    legacy_end timestamptz;
    lo timestamptz;
    name text;
    grantee regrole;
    made integer := 0;
BEGIN
    -- One caller at a time: a second reclaimer finds the months made (or makes them next round).
    IF NOT pg_try_advisory_xact_lock(hashtext('review_queue.event_months')) THEN
        RETURN 0;
    END IF;
    IF legacy IS NOT NULL THEN
        SELECT CAST((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]
                    AS timestamptz)
        INTO legacy_end FROM pg_class c WHERE c.oid = legacy;
    END IF;
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


def _role_exists(role: str) -> bool:
    return bool(op.get_bind().scalar(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}))


def upgrade() -> None:
    for table in ("review_queue_event", "review_queue_chain"):
        op.execute(_APPEND_ONLY.format(table=table))
    op.execute(_ARCHIVE_TABLE)
    op.execute(_APPEND_ONLY_BEFORE.format(table="review_queue_archive").replace(" OR REPLACE", ""))
    op.execute(
        "CREATE TRIGGER review_queue_archive_no_change BEFORE UPDATE OR DELETE ON review_queue_archive"
        " FOR EACH ROW EXECUTE FUNCTION review_queue_archive_append_only()"
    )
    op.execute(
        "CREATE TRIGGER review_queue_archive_no_truncate BEFORE TRUNCATE ON review_queue_archive"
        " FOR EACH STATEMENT EXECUTE FUNCTION review_queue_archive_append_only()"
    )
    op.execute(_APPLY)
    op.execute(
        "REVOKE EXECUTE ON FUNCTION review_queue_archive_apply"
        "(timestamptz, bigint, bytea, bigint, text, text, text) FROM PUBLIC"
    )
    app_role = context.config.attributes.get("app_role", APP_ROLE)
    if _role_exists(app_role):
        op.execute(f'REVOKE ALL ON review_queue_archive FROM "{app_role}"')
        op.execute(f'GRANT SELECT ON review_queue_archive TO "{app_role}"')
    if _role_exists(SEALER_ROLE):
        op.execute(f'GRANT SELECT ON review_queue_archive TO "{SEALER_ROLE}"')
    op.execute(_SEAL)
    op.execute(_ADD_MONTHS)


def downgrade() -> None:
    if op.get_bind().scalar(sa.text("SELECT 1 FROM review_queue_archive LIMIT 1")):
        raise MigrationRefused(
            "the chain's start is archived (review_queue_archive has rows); before this revision the"
            " chain had to start at seq 1, so the downgrade would leave a chain nothing can verify"
        )
    op.execute(earlier_revision("2026_12_04_0620_sealer_role_and_function.py")._SEAL.replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
    ))  # fmt: skip
    op.execute(earlier_revision("2026_12_05_0200_event_trail_by_month.py").ADD_MONTHS.replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
    ))  # fmt: skip
    op.execute(
        "DROP FUNCTION review_queue_archive_apply(timestamptz, bigint, bytea, bigint, text, text, text)"
    )
    op.execute("DROP TABLE review_queue_archive")
    op.execute("DROP FUNCTION review_queue_archive_append_only()")
    for table in ("review_queue_event", "review_queue_chain"):
        op.execute(_APPEND_ONLY_BEFORE.format(table=table))
