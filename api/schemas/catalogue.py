"""The resolution catalogue: codes and the approval policy."""

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from api.schemas.fields import NO_NUL, Strict, Text200, Timestamp, _storable
from api.schemas.money import Threshold


class ResolutionCodeIn(Strict):
    label: Text200
    description: Annotated[
        str, StringConstraints(max_length=2000, pattern=NO_NUL), AfterValidator(_storable)
    ] = ""
    requires_note: StrictBool = False  # `0` and `"true"` are a 422, as the schema says
    approval_threshold: Threshold | None = Field(
        default=None,
        description="A completion with abs(variance_amount) at or above it needs an approver; null: never.",
    )
    active: StrictBool = True


class ResolutionCodeOut(BaseModel):
    code: str
    label: str
    description: str
    requires_note: bool
    approval_threshold: Threshold | None
    active: bool
    updated_at: Timestamp
    effective_approval_threshold: Threshold | None = Field(
        description="From which abs(variance_amount) a completion with this code needs an approver:"
        " the lower of its approval_threshold and the catalogue's materiality_threshold"
        " (GET /resolutions/policy)."
    )

    model_config = ConfigDict(from_attributes=True)


class ResolutionsOut(BaseModel):
    resolutions: list[ResolutionCodeOut]


class ResolutionPolicyIn(Strict):
    materiality_threshold: Threshold = Field(
        description="A completion with abs(variance_amount) at or above it needs an approver, whatever"
        " its code, unless the code's own approval_threshold is lower."
    )


class ResolutionPolicyOut(BaseModel):
    materiality_threshold: Threshold
    base_currency: str = Field(
        description="The deployment's base currency (REVIEW_QUEUE_BASE_CURRENCY): of an item enqueued"
        " without a currency, and of the thresholds.",
        examples=["USD"],
    )
    updated_at: Timestamp
    updated_by: str | None = Field(description="The admin who set it; null: the default of the migration.")

    model_config = ConfigDict(from_attributes=True)
