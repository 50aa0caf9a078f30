CREATE OR REPLACE FUNCTION public.review_queue_canonical_json(v jsonb)
 RETURNS text
 LANGUAGE plpgsql
 IMMUTABLE PARALLEL SAFE
AS $function$
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
$function$;
