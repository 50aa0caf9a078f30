CREATE OR REPLACE TRIGGER review_queue_archive_no_change BEFORE DELETE OR UPDATE ON public.review_queue_archive FOR EACH ROW EXECUTE FUNCTION review_queue_archive_append_only();
