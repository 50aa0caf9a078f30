"""The schema as SQLAlchemy Core tables. Alembic owns the real DDL; `alembic check` keeps the two equal.

One module per purpose, all on the one `metadata`:
- base.py: `metadata` (and its naming convention), the types `Xid8` and `PgSnapshot`;
- queue.py: the items, their event trail, the resolved rollup /stats counts from;
- audit.py: the events' hash chain, the archives of its oldest part;
- catalogue.py: the resolution codes, the approval policy (materiality);
- tokens.py: the API tokens, the desk sessions signed in with one;
- webhooks.py: the subscriptions, their deliveries, the held events;
- oidc.py: the OpenID Connect sign-ins' used states, identities and desk sessions;
- fx.py: the exchange rates.

Import a table from here (`from db.tables import review_queue_item`), not from its module.

The reports' kept figures are in db/reports/tables.py, on the same `metadata`; the words the
contract and the CHECK constraints share are in db/vocabulary.py."""

# isort: skip_file
# In this order, not the alphabet's: each module adds its tables to `metadata` when imported, so this
# is the order of `metadata.tables` (the order the tables had in the single module this was).
from db.tables.base import PgSnapshot, Xid8, metadata
from db.tables.queue import review_queue_event, review_queue_item, review_queue_resolved_rollup
from db.tables.audit import review_queue_archive, review_queue_chain
from db.tables.catalogue import approval_policy, resolution_code
from db.tables.tokens import api_token, desk_session
from db.tables.webhooks import webhook_delivery, webhook_held, webhook_subscription
from db.tables.oidc import oidc_identity, oidc_session, oidc_used_state
from db.tables.fx import fx_rate

__all__ = [
    "PgSnapshot",
    "Xid8",
    "api_token",
    "approval_policy",
    "desk_session",
    "fx_rate",
    "metadata",
    "oidc_identity",
    "oidc_session",
    "oidc_used_state",
    "resolution_code",
    "review_queue_archive",
    "review_queue_chain",
    "review_queue_event",
    "review_queue_item",
    "review_queue_resolved_rollup",
    "webhook_delivery",
    "webhook_held",
    "webhook_subscription",
]
