"""The sealer is the only writer of the hash chain (issue 23, point 4).

Until now the application role could INSERT into `review_queue_chain` (a row with seq = max + 1
stops the sealer for good) and insert events with any id, time or transaction id. Now:

- `review_queue_seal(batch)` is a SECURITY DEFINER function owned by `review_queue_sealer`, a
  NOLOGIN role and the only one (besides the schema owner) with INSERT on the chain. It takes the
  chain's lock, reads the head, computes each link itself (the documented encoding of
  docs/audit.md, byte for byte what db/chain.py computes) and appends the rows. The application
  role may only EXECUTE it: it can make the sealer seal what is ready, never write a chain row.
- The application role may INSERT into `review_queue_event` only the columns an event's content
  is made of (item_id, event, actor, lease_epoch, trace_id, details): `id`, `at` and `xid`, which
  place an event in time and in the chain's order, always come from their defaults (the identity,
  now() and pg_current_xact_id()).

Why a function rather than a login role for the sealer: no second password to provision, store and
rotate beside the service's (the reclaimer that seals runs as the service), no second URL setting,
and nothing the service's credentials can do to the chain but ask for it to be extended correctly.

The hash format is unchanged; chains sealed before verify as they are.

Revision ID: 642667459b15
Revises: ffdf336e39e3
Create Date: 2026-12-04 06:20:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.migrations import MigrationRefused
from db.roles import APP_ROLE, SEALER_ROLE

revision: str = "642667459b15"
down_revision: str | None = "ffdf336e39e3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A string as Python's json.dumps(ensure_ascii=True) writes it: to_json escapes quotes, backslashes
# and control characters exactly as Python does (\b \f \n \r \t, else \u00xx); everything outside
# printable ASCII is then written as \uxxxx (lower-case hex; beyond the BMP, a surrogate pair).
# Single expressions, so that PostgreSQL inlines them into the sealer's query: per event, the
# encoding costs no function call but for nested objects, arrays and non-ASCII text.
_JSON_ASCII = r"""
CREATE FUNCTION review_queue_json_ascii(quoted text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT string_agg(
        CASE
            WHEN ascii(c) < 127 THEN c
            WHEN ascii(c) < 65536 THEN '\u' || lpad(to_hex(ascii(c)), 4, '0')
            ELSE '\u' || to_hex(55296 + ((ascii(c) - 65536) >> 10))
                || '\u' || to_hex(56320 + ((ascii(c) - 65536) & 1023))
        END, '' ORDER BY n)
    FROM regexp_split_to_table(quoted, '') WITH ORDINALITY AS t(c, n)
$$
"""
_JSON_STRING = r"""
CREATE FUNCTION review_queue_json_string(s text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN octet_length(s) = length(s) AND strpos(s, chr(127)) = 0 THEN to_json(s)::text
                ELSE review_queue_json_ascii(to_json(s)::text) END
$$
"""
# Canonical JSON of a jsonb value (db/chain.py canonical_details): object keys sorted by code point
# (the C collation's byte order in UTF-8), no whitespace, numbers exactly as jsonb prints them.
_JSON_MEMBERS = r"""
CREATE FUNCTION review_queue_json_members(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '{' || coalesce((
        SELECT string_agg(review_queue_json_string(key) || ':' || review_queue_json_value(value), ','
                          ORDER BY key COLLATE "C")
        FROM jsonb_each(v)), '') || '}'
$$
"""
_JSON_VALUE = r"""
CREATE FUNCTION review_queue_json_value(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE jsonb_typeof(v)
        WHEN 'string' THEN review_queue_json_string(v #>> '{}')
        WHEN 'object' THEN review_queue_canonical_json(v)
        WHEN 'array' THEN review_queue_canonical_json(v)
        ELSE v::text  -- a number, true, false or null, as jsonb prints it
    END
$$
"""
# Nested objects and arrays (plpgsql: it recurses, and keeps its plans for the session).
_CANONICAL = r"""
CREATE FUNCTION review_queue_canonical_json(v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF jsonb_typeof(v) = 'object' THEN
        RETURN review_queue_json_members(v);
    ELSIF jsonb_typeof(v) = 'array' THEN
        RETURN '[' || coalesce((
            SELECT string_agg(review_queue_json_value(value), ',' ORDER BY n)
            FROM jsonb_array_elements(v) WITH ORDINALITY AS t(value, n)), '') || ']';
    END IF;
    RETURN review_queue_json_value(v);
END
$$
"""
# None of these helpers sets a search_path (that would stop the inlining and cost a settings push
# and pop per call): the sealer calls them, and its own search_path is fixed.

# The sealer (db/audit.py documents the algorithm): under the chain's advisory lock, append the
# events of finished transactions (xid below the snapshot's xmin) in (xid, id) order after the head.
# SECURITY DEFINER with a fixed search_path, pg_temp last: otherwise a caller's temporary table
# named review_queue_chain (or _event) would be found first (PostgreSQL's documented pitfall).
_SEAL = r"""
CREATE FUNCTION review_queue_seal(batch integer) RETURNS integer
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
    IF FOUND THEN
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

_HELPERS = (
    "review_queue_json_ascii(text)",
    "review_queue_json_string(text)",
    "review_queue_json_members(jsonb)",
    "review_queue_json_value(jsonb)",
    "review_queue_canonical_json(jsonb)",
)
# What the content of an event is: the only columns the application role may insert.
EVENT_CONTENT = "item_id, event, actor, lease_epoch, trace_id, details"


def _quoted(role: str) -> str:
    return '"' + role.replace('"', '""') + '"'


def _role_exists(role: str) -> bool:
    return bool(
        op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
    )


def _sealer_may_own() -> bool:
    """Whether the function can be given to the sealer role: it exists (created here when this user
    may), and this user may act as it (superuser, or a member)."""
    bind = op.get_bind()
    me = bind.execute(
        sa.text("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")
    ).one()
    if not _role_exists(SEALER_ROLE) and (me.rolsuper or me.rolcreaterole):
        op.execute(f"CREATE ROLE {_quoted(SEALER_ROLE)} NOLOGIN")
    if not _role_exists(SEALER_ROLE):
        return False
    member = bind.execute(
        sa.text("SELECT pg_has_role(current_user, :r, 'MEMBER')"), {"r": SEALER_ROLE}
    ).scalar()
    return bool(me.rolsuper or member)


def upgrade() -> None:
    app_role = context.config.attributes.get("app_role", APP_ROLE)
    separated = _role_exists(app_role)
    # The JSON helpers call each other (objects hold objects): a body checked at CREATE would not
    # find the ones created after it.
    op.execute("SET LOCAL check_function_bodies = off")
    for statement in (_JSON_ASCII, _JSON_STRING, _JSON_MEMBERS, _JSON_VALUE, _CANONICAL, _SEAL):
        op.execute(statement)
    op.execute("SET LOCAL check_function_bodies = on")
    op.execute("REVOKE EXECUTE ON FUNCTION review_queue_seal(integer) FROM PUBLIC")
    if _sealer_may_own():
        sealer = _quoted(SEALER_ROLE)
        # The definer's rights, and no more: read the events and the chain, append to the chain.
        op.execute(f"GRANT USAGE ON SCHEMA public TO {sealer}")
        op.execute(f"GRANT SELECT ON review_queue_event TO {sealer}")
        op.execute(f"GRANT SELECT, INSERT ON review_queue_chain TO {sealer}")
        # Taking ownership needs CREATE on the schema (PostgreSQL's rule), for that moment only.
        grant_create = bool(
            op.get_bind()
            .execute(sa.text("SELECT NOT has_schema_privilege(:r, 'public', 'CREATE')"), {"r": SEALER_ROLE})
            .scalar()
        )
        if grant_create:
            op.execute(f"GRANT CREATE ON SCHEMA public TO {sealer}")
        for function in _HELPERS:
            op.execute(f"ALTER FUNCTION {function} OWNER TO {sealer}")
        op.execute(f"ALTER FUNCTION review_queue_seal(integer) OWNER TO {sealer}")
        if grant_create:
            op.execute(f"REVOKE CREATE ON SCHEMA public FROM {sealer}")
    elif separated:
        raise MigrationRefused(
            f"the hash chain's sealer runs as the NOLOGIN role {SEALER_ROLE}, which must exist and be"
            " granted to the role that runs the migrations. As a superuser, once:"
            f" CREATE ROLE {SEALER_ROLE} NOLOGIN; GRANT {SEALER_ROLE} TO <the migrating role>;"
            " then run the migration again (docs/security.md, The database roles)."
        )
    if separated:
        app = _quoted(app_role)
        op.execute(f"REVOKE INSERT ON review_queue_chain FROM {app}")
        op.execute(f"GRANT EXECUTE ON FUNCTION review_queue_seal(integer) TO {app}")
        op.execute(f"REVOKE INSERT ON review_queue_event FROM {app}")
        op.execute(f"GRANT INSERT ({EVENT_CONTENT}) ON review_queue_event TO {app}")


def downgrade() -> None:
    app_role = context.config.attributes.get("app_role", APP_ROLE)
    if _role_exists(app_role):
        app = _quoted(app_role)
        op.execute(f"REVOKE INSERT ({EVENT_CONTENT}) ON review_queue_event FROM {app}")
        op.execute(f"GRANT INSERT ON review_queue_event TO {app}")
        op.execute(f"GRANT INSERT ON review_queue_chain TO {app}")
    op.execute("DROP FUNCTION review_queue_seal(integer)")
    for function in reversed(_HELPERS):
        op.execute(f"DROP FUNCTION {function}")
    if _role_exists(SEALER_ROLE):
        sealer = _quoted(SEALER_ROLE)
        op.execute(f"REVOKE ALL ON review_queue_event, review_queue_chain FROM {sealer}")
        op.execute(f"REVOKE USAGE ON SCHEMA public FROM {sealer}")
