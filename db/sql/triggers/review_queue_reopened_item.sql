CREATE OR REPLACE TRIGGER review_queue_reopened_item AFTER INSERT ON public.review_queue_event FOR EACH ROW WHEN ((new.event = 'REOPENED'::text)) EXECUTE FUNCTION review_queue_reopened_item();
