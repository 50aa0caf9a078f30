"""The service itself: health, problem details, sessions and sign-in."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.schemas.fields import Strict
from db.vocabulary import Role


class Health(BaseModel):
    status: Literal["ok"]


class Problem(BaseModel):
    """RFC 9457 problem details, as every 4xx and 5xx body (some codes add members, e.g. item_id)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[dict[str, object]] | None = None


class SessionIn(Strict):
    token: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="A bearer token (from `review-queue token create`), exchanged for a session cookie."
    )


class SessionOut(BaseModel):
    subject: str
    role: Role
    csrf_token: str | None = Field(
        description="Send it as X-CSRF-Token with every write made with the session cookie; "
        "null when the caller used a bearer token."
    )
    lease_s: float = Field(description="Lease duration (REVIEW_QUEUE_LOCK_TIMEOUT_MS) in seconds.")
    idle_release_s: int = Field(description="REVIEW_QUEUE_UI_IDLE_RELEASE_S: the desk releases idle work.")
    max_wait_s: int = Field(description="The largest wait_s of POST /leases.")
    release_cooldown_s: int = Field(
        description="REVIEW_QUEUE_RELEASE_COOLDOWN_S: an item you release goes to others for this long."
    )


class OidcProviderOut(BaseModel):
    """Whether the desk offers sign-in with the company's identity provider (OpenID Connect)."""

    enabled: bool
    provider_name: str | None = Field(
        description='For the desk\'s "Sign in with <provider_name>"; null when OIDC sign-in is off.'
    )
    login_url: str | None = Field(description="Where the browser goes to sign in; null when off.")


class SignOutOut(BaseModel):
    end_session_url: str = Field(
        description="The provider's end-session endpoint (RP-Initiated Logout): send the browser there"
        " to end the provider's session too."
    )
