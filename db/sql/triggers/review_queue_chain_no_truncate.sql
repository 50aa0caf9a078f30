CREATE OR REPLACE TRIGGER review_queue_chain_no_truncate BEFORE TRUNCATE ON public.review_queue_chain FOR EACH STATEMENT EXECUTE FUNCTION review_queue_chain_append_only();
