CREATE OR REPLACE FUNCTION public.review_queue_chain_append_only()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- review_queue_archive_apply sets this for its own transaction; no other role may DELETE.
    IF TG_OP = 'DELETE' AND current_setting('review_queue.archiving', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'review_queue_chain is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$function$;
