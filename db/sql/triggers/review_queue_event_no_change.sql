CREATE OR REPLACE TRIGGER review_queue_event_no_change BEFORE DELETE OR UPDATE ON public.review_queue_event FOR EACH ROW EXECUTE FUNCTION review_queue_event_append_only();
