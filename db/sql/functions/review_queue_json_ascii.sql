CREATE OR REPLACE FUNCTION public.review_queue_json_ascii(quoted text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT string_agg(
        CASE
            WHEN ascii(c) < 127 THEN c
            WHEN ascii(c) < 65536 THEN '\u' || lpad(to_hex(ascii(c)), 4, '0')
            ELSE '\u' || to_hex(55296 + ((ascii(c) - 65536) >> 10))
                || '\u' || to_hex(56320 + ((ascii(c) - 65536) & 1023))
        END, '' ORDER BY n)
    FROM regexp_split_to_table(quoted, '') WITH ORDINALITY AS t(c, n)
$function$;
