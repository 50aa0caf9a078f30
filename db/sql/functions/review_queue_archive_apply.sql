CREATE OR REPLACE FUNCTION public.review_queue_archive_apply(cutoff timestamp with time zone, first_seq bigint, previous_hash bytea, through_seq bigint, through_hash bytea, file_items bigint, events_sha256 text, items_sha256 text, archived_by text)
 RETURNS bigint
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
 SET "TimeZone" TO 'UTC'
 SET lock_timeout TO '5s'
AS $function$
DECLARE
    start_seq bigint := 0;
    start_hash bytea := decode(repeat('00', 32), 'hex');
    start record;
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
    SELECT a.through_seq, a.through_hash INTO start
    FROM review_queue_archive a ORDER BY a.through_seq DESC LIMIT 1;
    IF FOUND THEN
        start_seq := start.through_seq;
        start_hash := start.through_hash;
    END IF;
    IF first_seq IS DISTINCT FROM start_seq + 1 OR previous_hash IS DISTINCT FROM start_hash THEN
        RAISE EXCEPTION 'the files start at seq %, but the live chain starts at seq % (another archive ran)',
            first_seq, start_seq + 1 USING ERRCODE = 'RQ010';
    END IF;
    IF through_seq IS NULL OR through_seq <= start_seq THEN
        RAISE EXCEPTION 'seq % is already archived (the live chain starts after seq %)',
            through_seq, start_seq USING ERRCODE = 'RQ010';
    END IF;
    SELECT c.hash, e.xid, e.id INTO mark
    FROM review_queue_chain c JOIN review_queue_event e ON e.id = c.event_id WHERE c.seq = through_seq;
    IF NOT FOUND OR mark.hash IS DISTINCT FROM through_hash THEN
        RAISE EXCEPTION 'the chain at seq % is not what the file holds', through_seq USING ERRCODE = 'RQ010';
    END IF;
    IF EXISTS (SELECT FROM review_queue_event e
               WHERE e.at < cutoff AND (e.xid, e.id) > (mark.xid, mark.id)) THEN
        RAISE EXCEPTION 'an event before % is not in the range: seal first', cutoff USING ERRCODE = 'RQ010';
    END IF;
    -- No row lock: a revision that reopens an item of the range and commits after this check is a
    -- reopening after the archive (the item keeps its row, its earlier events are in the file).
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
    -- on the parent) until the commit, and every lease and completion writes an event. A partition
    -- with no upper bound (DEFAULT, or TO MAXVALUE) is never dropped.
    FOR part IN
        SELECT c.oid::regclass AS name,
               CAST((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]
                    AS timestamptz) AS upper_bound
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.review_queue_event'::regclass
    LOOP
        CONTINUE WHEN part.upper_bound IS NULL OR part.upper_bound > cutoff;
        -- No row may join it between its count and its drop (only the owner can write an old `at`).
        EXECUTE format('LOCK TABLE %s IN SHARE MODE', part.name);
        EXECUTE format('SELECT count(*) FROM %s', part.name) INTO n;
        removed := removed + n;
        dropped := dropped || part.name;
        drop_edge := greatest(drop_edge, part.upper_bound);
    END LOOP;
    -- The rest of the range, row by row: its few events in later months, or the legacy (or DEFAULT)
    -- partition's while the cutoff falls inside it (the months about to be dropped are left out by
    -- their bound).
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
$function$;
