"""Financial controls: the resolution catalogue and maker-checker approval (issue 12, parts 1 and 2).

`resolution_code` is the organisation's catalogue, seeded with a default set for reconciliation
work. Codes are deactivated, never deleted, so the application role loses DELETE and TRUNCATE on
it. Existing items keep their free-text resolution: there is no foreign key from the item.

Items gain the AWAITING_APPROVAL state (a completion at or above its code's approval threshold)
and the columns of a proposal and its approval. An approval lease is an AWAITING_APPROVAL row
with leased_by set; the database itself refuses one held by the item's preparer.

Revision ID: 5e1c0a7d2b94
Revises: a9d3c5e7f120
Create Date: 2026-12-03 11:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import context, op
from db.roles import APP_ROLE

revision: str = "5e1c0a7d2b94"
down_revision: str | None = "a9d3c5e7f120"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES_BEFORE = "state IN ('PENDING', 'ASSIGNED', 'RESOLVED', 'QUARANTINED')"
_STATES_AFTER = "state IN ('PENDING', 'ASSIGNED', 'RESOLVED', 'QUARANTINED', 'AWAITING_APPROVAL')"
_EVENTS_BEFORE = (
    "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
    " 'QUARANTINED', 'REQUEUED', 'REOPENED', 'REVISED', 'REASSIGNED')"
)
_EVENTS_AFTER = (
    "event IN ('ENQUEUED', 'LEASED', 'RENEWED', 'RELEASED', 'RECLAIMED', 'RESOLVED',"
    " 'QUARANTINED', 'REQUEUED', 'REOPENED', 'REVISED', 'REASSIGNED', 'SUBMITTED_FOR_APPROVAL',"
    " 'APPROVED', 'REJECTED')"
)
_ROLES_BEFORE = "role IN ('reviewer', 'ingest', 'auditor', 'admin')"
_ROLES_AFTER = "role IN ('reviewer', 'approver', 'ingest', 'auditor', 'admin')"

# (code, label, description, requires_note, approval_threshold)
DEFAULT_CODES = [
    ("MATCH_CONFIRMED", "Match confirmed", "The two sides agree; the matcher was too strict.", False, None),
    ("MATCH_REJECTED", "Match rejected", "The proposed match is wrong; the sides stay open.", False, None),
    (
        "TIMING_DIFFERENCE",
        "Timing difference",
        "The entries settle in a later period; no posting needed.",
        False,
        None,
    ),
    (
        "ADJUSTMENT_POSTED",
        "Adjustment posted",
        "A correcting journal entry was posted; give its reference in the note.",
        True,
        "10000.00",
    ),
    ("WRITE_OFF", "Write-off", "The variance is written off; say why in the note.", True, "1000.00"),
    ("ESCALATED", "Escalated", "Handed to another team; say to whom in the note.", True, None),
    # The desk's and the API examples' codes before the catalogue existed.
    ("APPROVED", "Approved as is", "The variance is accepted without a posting.", False, None),
    ("REJECTED", "Rejected", "The variance is not accepted; the source must be corrected.", False, None),
]


def _replace_check(table: str, name: str, condition: str, *, not_valid: bool = False) -> None:
    op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({condition}){' NOT VALID' * not_valid}")


def upgrade() -> None:
    catalogue = op.create_table(
        "resolution_code",
        sa.Column("code", sa.Text(), nullable=False),
        sa.Column("label", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("requires_note", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("approval_threshold", sa.Numeric(18, 2), nullable=True),
        sa.Column("active", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("code ~ '^[A-Z][A-Z0-9_]{0,63}$'", name=op.f("ck_resolution_code_valid_code")),
        sa.CheckConstraint(
            "approval_threshold IS NULL OR approval_threshold >= 0",
            name=op.f("ck_resolution_code_threshold_not_negative"),
        ),
        sa.PrimaryKeyConstraint("code", name=op.f("pk_resolution_code")),
    )
    op.bulk_insert(
        catalogue,
        [
            {
                "code": code,
                "label": label,
                "description": description,
                "requires_note": requires_note,
                "approval_threshold": threshold,
            }
            for code, label, description, requires_note, threshold in DEFAULT_CODES
        ],
    )
    role = context.config.attributes.get("app_role", APP_ROLE)
    quoted, literal = '"' + role.replace('"', '""') + '"', role.replace("'", "''")
    op.execute(
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{literal}') THEN"
        f" EXECUTE 'REVOKE DELETE, TRUNCATE ON resolution_code FROM {quoted.replace(chr(39), chr(39) * 2)}';"
        " END IF; END $$"
    )

    for column in ("prepared_by", "proposed_resolution", "proposed_note", "approved_by"):
        op.add_column("review_queue_item", sa.Column(column, sa.Text(), nullable=True))
    for column in ("prepared_at", "approved_at"):
        op.add_column("review_queue_item", sa.Column(column, sa.DateTime(timezone=True), nullable=True))
    _replace_check("review_queue_item", "ck_review_queue_item_valid_state", _STATES_AFTER)
    op.create_check_constraint(
        op.f("ck_review_queue_item_awaiting_has_proposal"),
        "review_queue_item",
        "state <> 'AWAITING_APPROVAL' OR (prepared_by IS NOT NULL AND proposed_resolution IS NOT NULL)",
    )
    op.create_check_constraint(
        op.f("ck_review_queue_item_approval_lease_not_preparer"),
        "review_queue_item",
        "state <> 'AWAITING_APPROVAL' OR leased_by IS NULL OR leased_by <> prepared_by",
    )
    op.create_check_constraint(
        op.f("ck_review_queue_item_four_eyes"),
        "review_queue_item",
        "approved_by IS NULL OR (approved_by <> resolved_by AND approved_at IS NOT NULL)",
    )
    op.create_index(
        "ix_review_queue_item_awaiting_approval",
        "review_queue_item",
        ["due_at", "created_at"],
        postgresql_where=sa.text("state = 'AWAITING_APPROVAL' AND leased_by IS NULL"),
    )
    op.create_index(
        "ix_review_queue_item_approval_lease_expiry",
        "review_queue_item",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'AWAITING_APPROVAL' AND leased_by IS NOT NULL"),
    )
    _replace_check("review_queue_event", "ck_review_queue_event_valid_event", _EVENTS_AFTER)
    _replace_check("api_token", "ck_api_token_valid_role", _ROLES_AFTER)


def downgrade() -> None:
    op.execute("DELETE FROM api_token WHERE role = 'approver'")
    _replace_check("api_token", "ck_api_token_valid_role", _ROLES_BEFORE)
    # Events are append-only: the new kinds stay, so the old CHECK is added NOT VALID.
    _replace_check("review_queue_event", "ck_review_queue_event_valid_event", _EVENTS_BEFORE, not_valid=True)
    op.drop_index("ix_review_queue_item_approval_lease_expiry", table_name="review_queue_item")
    op.drop_index("ix_review_queue_item_awaiting_approval", table_name="review_queue_item")
    for name in ("four_eyes", "approval_lease_not_preparer", "awaiting_has_proposal"):
        op.drop_constraint(op.f(f"ck_review_queue_item_{name}"), "review_queue_item", type_="check")
    # A proposal awaiting approval goes back to the queue, in its old place.
    op.execute(
        "UPDATE review_queue_item SET state = 'PENDING', leased_by = NULL, leased_at = NULL,"
        " lease_expires_at = NULL WHERE state = 'AWAITING_APPROVAL'"
    )
    _replace_check("review_queue_item", "ck_review_queue_item_valid_state", _STATES_BEFORE)
    for column in (
        "approved_at",
        "prepared_at",
        "approved_by",
        "proposed_note",
        "proposed_resolution",
        "prepared_by",
    ):
        op.drop_column("review_queue_item", column)
    op.drop_table("resolution_code")
