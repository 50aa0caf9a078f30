CREATE OR REPLACE FUNCTION public.review_queue_json_string(s text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE WHEN octet_length(s) = length(s) AND strpos(s, chr(127)) = 0 THEN to_json(s)::text
                ELSE review_queue_json_ascii(to_json(s)::text) END
$function$;
