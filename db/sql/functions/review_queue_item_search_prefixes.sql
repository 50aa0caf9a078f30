CREATE OR REPLACE FUNCTION public.review_queue_item_search_prefixes(idempotency_key text, ledger_entity text, context jsonb)
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
RETURN ARRAY(SELECT "left"(v.v, n.n) AS "left" FROM unnest((ARRAY[lower(review_queue_item_search_prefixes.idempotency_key), lower(review_queue_item_search_prefixes.ledger_entity)] || ARRAY(SELECT lower((v_1.v #>> '{}'::text[])) AS lower FROM jsonb_path_query(review_queue_item_search_prefixes.context, 'strict $.**?(@.type() == "string" || @.type() == "number")'::jsonpath) v_1(v)))) v(v), LATERAL generate_series(1, LEAST(length(v.v), 32)) n(n))
;
