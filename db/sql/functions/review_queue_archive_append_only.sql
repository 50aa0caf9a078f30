CREATE OR REPLACE FUNCTION public.review_queue_archive_append_only()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'review_queue_archive is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$function$;
