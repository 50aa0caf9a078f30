CREATE OR REPLACE FUNCTION public.review_queue_reopened_item()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO review_queue_reopened_item (item_id, due_at)
    SELECT id, due_at FROM review_queue_item WHERE id = NEW.item_id
    ON CONFLICT (item_id) DO NOTHING;
    UPDATE review_queue_item SET reopened = true WHERE id = NEW.item_id AND NOT reopened;
    RETURN NULL;
END
$function$;
