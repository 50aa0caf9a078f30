"""What a decision may be and when it needs an approver: the resolution codes and the
catalogue-wide materiality threshold."""

from sqlalchemy import Boolean, CheckConstraint, Column, DateTime, Numeric, Table, Text, func, text

from db.tables.base import metadata

# The resolution catalogue, managed by admins (PUT /resolutions/{code}). Deactivated, never
# deleted: an old decision keeps its meaning. Items keep their resolution as text (no foreign
# key), so rows from before the catalogue stay as they are.
resolution_code = Table(
    "resolution_code",
    metadata,
    Column("code", Text, primary_key=True),
    Column("label", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("requires_note", Boolean, nullable=False, server_default=text("false")),
    # A completion with abs(variance_amount) at or above it needs an approver; NULL: never.
    Column("approval_threshold", Numeric(18, 2, asdecimal=True)),
    Column("active", Boolean, nullable=False, server_default=text("true")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("code ~ '^[A-Z][A-Z0-9_]{0,63}$'", name="valid_code"),
    CheckConstraint("approval_threshold IS NULL OR approval_threshold >= 0", name="threshold_not_negative"),
)

# The catalogue-wide approval threshold (materiality): one row. A completion at or above it by
# absolute amount needs an approver, whatever its code, unless the code's own threshold is lower.
approval_policy = Table(
    "approval_policy",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("materiality_threshold", Numeric(18, 2, asdecimal=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_by", Text),  # the admin who set it; NULL: the migration's default
    CheckConstraint("id", name="one_row"),
    CheckConstraint("materiality_threshold >= 0", name="threshold_not_negative"),
)
