CREATE OR REPLACE TRIGGER review_queue_chain_no_change BEFORE DELETE OR UPDATE ON public.review_queue_chain FOR EACH ROW EXECUTE FUNCTION review_queue_chain_append_only();
