CREATE OR REPLACE TRIGGER review_queue_archive_no_truncate BEFORE TRUNCATE ON public.review_queue_archive FOR EACH STATEMENT EXECUTE FUNCTION review_queue_archive_append_only();
