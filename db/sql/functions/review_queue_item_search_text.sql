CREATE OR REPLACE FUNCTION public.review_queue_item_search_text(idempotency_key text, ledger_entity text, context jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
RETURN (((((''::text || lower(idempotency_key)) || ''::text) || lower(ledger_entity)) || ''::text) || COALESCE(array_to_string(ARRAY(SELECT lower((v.v #>> '{}'::text[])) AS lower FROM jsonb_path_query(review_queue_item_search_text.context, 'strict $.**?(@.type() == "string" || @.type() == "number")'::jsonpath) v(v)), ''::text), ''::text))
;
