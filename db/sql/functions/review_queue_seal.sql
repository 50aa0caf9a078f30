CREATE OR REPLACE FUNCTION public.review_queue_seal(batch integer)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
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
$function$;
