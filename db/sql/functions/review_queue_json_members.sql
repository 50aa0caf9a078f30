CREATE OR REPLACE FUNCTION public.review_queue_json_members(v jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT '{' || coalesce((
        SELECT string_agg(review_queue_json_string(key) || ':' || review_queue_json_value(value), ','
                          ORDER BY key COLLATE "C")
        FROM jsonb_each(v)), '') || '}'
$function$;
