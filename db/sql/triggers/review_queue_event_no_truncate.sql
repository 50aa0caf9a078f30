CREATE OR REPLACE TRIGGER review_queue_event_no_truncate BEFORE TRUNCATE ON public.review_queue_event FOR EACH STATEMENT EXECUTE FUNCTION review_queue_event_append_only();
