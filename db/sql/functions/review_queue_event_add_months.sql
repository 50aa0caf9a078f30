CREATE OR REPLACE FUNCTION public.review_queue_event_add_months(ahead integer)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
 SET "TimeZone" TO 'UTC'
 SET lock_timeout TO '500ms'
AS $function$
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
$function$;
