CREATE OR REPLACE FUNCTION public.review_queue_json_value(v jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE jsonb_typeof(v)
        WHEN 'string' THEN review_queue_json_string(v #>> '{}')
        WHEN 'object' THEN review_queue_canonical_json(v)
        WHEN 'array' THEN review_queue_canonical_json(v)
        ELSE v::text  -- a number, true, false or null, as jsonb prints it
    END
$function$;
