CREATE OR REPLACE FUNCTION public.review_queue_event_lease_start()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
        BEGIN
            NEW.leased_at := (
                SELECT l.at FROM review_queue_event l
                WHERE l.item_id = NEW.item_id AND l.id < NEW.id AND l.event IN ('LEASED', 'REASSIGNED')
                ORDER BY l.id DESC LIMIT 1
            );
            RETURN NEW;
        END
        $function$;
