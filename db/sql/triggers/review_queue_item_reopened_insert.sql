CREATE OR REPLACE TRIGGER review_queue_item_reopened_insert BEFORE INSERT ON public.review_queue_item FOR EACH ROW WHEN (new.reopened) EXECUTE FUNCTION review_queue_item_reopened_guard();
