CREATE OR REPLACE FUNCTION public.review_queue_item_reopened_guard()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
BEGIN
    IF NEW.reopened IS DISTINCT FROM
       (TG_OP = 'UPDATE' AND EXISTS (SELECT FROM review_queue_reopened_item WHERE item_id = NEW.id)) THEN
        RAISE EXCEPTION 'review_queue_item.reopened is kept by the database (a REOPENED event sets it)'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$function$;
