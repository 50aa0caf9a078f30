"""Every knob of the service, read from the environment once and validated at start-up."""

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from api.schemas.fields import TimeZone
from api.schemas.money import CurrencyCode
from api.setting_values import (
    ApiClients,
    RoleMap,
    SlaTiers,
    parse_api_clients,
    parse_role_map,
    parse_sla_tiers,
    web_origin,
)
from db import urls
from db.roles import APP_ROLE
from db.vocabulary import DEFAULT_BASE_CURRENCY, DEFAULT_MAX_ATTEMPTS, DEFAULT_SLA_TIERS

REPO_ROOT = Path(__file__).resolve().parent.parent
POSTGRESQL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


def _range(default: int, lo: int, hi: int, env: str) -> int:
    # Annotated metadata keeps the range next to the name, so the start-up error can quote both.
    return Field(default=default, ge=lo, le=hi, validation_alias=env)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    # None means: start (or join) the embedded PostgreSQL under data_dir.
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    # The schema owner, for migrations; unset means DATABASE_URL (or the embedded owner role).
    migration_database_url: str | None = Field(
        default=None, validation_alias="REVIEW_QUEUE_MIGRATION_DATABASE_URL"
    )
    # Lag-tolerant reads (the reports, /stats, the decisions export) go here when set: a standby,
    # up to its replication lag behind. The queue's writes and reads, and the feed, stay on DATABASE_URL.
    read_database_url: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_READ_DATABASE_URL")
    # The one LISTEN connection per API process (wake-ups of POST /leases with wait_s) goes here when
    # set: PostgreSQL itself when DATABASE_URL is a pooler in transaction mode, where LISTEN is lost.
    listen_database_url: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_LISTEN_DATABASE_URL")
    # The role the migrations grant the service's rights to (DATABASE_URL's user in production).
    app_role: str = Field(
        default=APP_ROLE, pattern=r"^[a-z_][a-z0-9_]{0,62}$", validation_alias="REVIEW_QUEUE_APP_ROLE"
    )
    data_dir: Path = Field(default=REPO_ROOT / ".data", validation_alias="REVIEW_QUEUE_DATA_DIR")

    # The seed's configuration table, with its defaults and ranges.
    batch_size: int = _range(20, 1, 200, "REVIEW_QUEUE_BATCH_SIZE")
    lock_timeout_ms: int = _range(30_000, 1_000, 120_000, "REVIEW_QUEUE_LOCK_TIMEOUT_MS")
    reclaim_after_s: int = _range(45, 10, 600, "REVIEW_QUEUE_RECLAIM_AFTER_S")
    max_inflight: int = _range(1_000, 100, 10_000, "REVIEW_QUEUE_MAX_INFLIGHT")
    poll_interval_ms: int = _range(500, 50, 5_000, "REVIEW_QUEUE_POLL_INTERVAL_MS")
    # GET /events calls with wait_s waiting at once per API process; one more is a 429.
    feed_max_waiters: int = _range(500, 1, 100_000, "REVIEW_QUEUE_FEED_MAX_WAITERS")
    # Reads a second for the GET /events calls with wait_s of one API process, whatever their
    # number: the work routes keep their latency, the pollers wait their turn (routes/feed.py).
    # 25 = the 500 waiters REVIEW_QUEUE_FEED_MAX_WAITERS admits / the longest wait_s (20 s): at
    # the limit, every waiting call still gets its turn within its wait.
    feed_answers_per_s: int = _range(25, 1, 100_000, "REVIEW_QUEUE_FEED_ANSWERS_PER_S")

    # PostgreSQL's own lock_timeout for every API transaction: a table lock elsewhere
    # turns into a fast 503 instead of a hung request (seed: LOCK_CONTENTION).
    pg_lock_timeout_ms: int = _range(500, 10, 60_000, "REVIEW_QUEUE_PG_LOCK_TIMEOUT_MS")
    statement_timeout_ms: int = _range(5_000, 100, 600_000, "REVIEW_QUEUE_STATEMENT_TIMEOUT_MS")
    max_leases_per_reviewer: int = _range(200, 1, 10_000, "REVIEW_QUEUE_MAX_LEASES_PER_REVIEWER")
    # A holder who releases an item is not handed it again by their own leases for this long (others
    # get it in its old place): Release then Next moves on instead of bringing the same item back.
    release_cooldown_s: int = _range(900, 0, 86_400, "REVIEW_QUEUE_RELEASE_COOLDOWN_S")
    # A rejected proposal goes back to its preparer first for this long: only their unnamed lease
    # takes it (ahead of due order); then anyone's, in its due-date place.
    rejected_return_s: int = _range(14_400, 0, 604_800, "REVIEW_QUEUE_REJECTED_RETURN_S")
    reclaim_interval_s: int = _range(15, 1, 600, "REVIEW_QUEUE_RECLAIM_INTERVAL_S")
    # The zone whose closed days and weeks the reclaimer keeps for the throughput and backlog reports
    # (the controllers' zone); a report asked in another zone reads the trail, as fast as before.
    report_time_zone: TimeZone = Field(default="UTC", validation_alias="REVIEW_QUEUE_REPORT_TIME_ZONE")
    # The currency of an item enqueued without one, of the thresholds and of the rates (issue 40).
    # The migration that brought currencies gave it to every item enqueued before: keep it.
    base_currency: CurrencyCode = Field(
        default=DEFAULT_BASE_CURRENCY, validation_alias="REVIEW_QUEUE_BASE_CURRENCY"
    )
    # Months of event-trail partitions the reclaimer keeps created ahead of now: an event whose month
    # has no partition cannot be written, so this is how long the service can write with no reclaimer.
    event_months_ahead: int = _range(3, 1, 24, "REVIEW_QUEUE_EVENT_MONTHS_AHEAD")
    # How long decisions stay live: `review-queue archive` moves nothing newer than this many days
    # (its default cutoff is the first of the month at or before then). Seven years by default.
    retain_resolved_days: int = _range(2557, 30, 36_525, "REVIEW_QUEUE_RETAIN_RESOLVED_DAYS")
    # Leases an item gets before a release or reclaim quarantines it (a poison item). Its default
    # lives in db.vocabulary, not db.queue: db.queue creates the Prometheus counters, and `serve` must
    # choose multiprocess mode before they exist (tests/system/test_cli.py checks both).
    max_attempts: int = _range(DEFAULT_MAX_ATTEMPTS, 1, 1_000, "REVIEW_QUEUE_MAX_ATTEMPTS")

    # Deadlines of items enqueued without a due_at, by abs(variance_amount); see parse_sla_tiers.
    sla_tiers: Annotated[SlaTiers, NoDecode] = Field(
        default=parse_sla_tiers(DEFAULT_SLA_TIERS), validation_alias="REVIEW_QUEUE_SLA_TIERS"
    )

    pool_size: int = _range(10, 1, 200, "REVIEW_QUEUE_POOL_SIZE")
    pool_max_overflow: int = _range(5, 0, 200, "REVIEW_QUEUE_POOL_MAX_OVERFLOW")
    # A request waits for a connection as long as PgBouncer's query_wait_timeout (docs/production.md):
    # on a busy host the queue ahead of it is the event loop's backlog, not a dead database, and 1 s
    # gave one 503 in 600 completions at 30 clients per process (docs/capacity.md, "The pool").
    pool_timeout_ms: int = _range(5_000, 10, 60_000, "REVIEW_QUEUE_POOL_TIMEOUT_MS")
    connect_timeout_s: int = _range(2, 1, 60, "REVIEW_QUEUE_CONNECT_TIMEOUT_S")
    # How soon a connection to a server that went silent (a hung or unplugged primary: no RST) is
    # found dead, instead of TCP's 15 minutes: keepalive probes on an idle connection, and
    # tcp_user_timeout on one with unacknowledged data. Added to DATABASE_URL's options unless it
    # sets them itself (docs/production.md, "High availability").
    db_keepalives_idle_s: int = _range(10, 1, 600, "REVIEW_QUEUE_DB_KEEPALIVES_IDLE_S")
    db_keepalives_interval_s: int = _range(3, 1, 60, "REVIEW_QUEUE_DB_KEEPALIVES_INTERVAL_S")
    db_keepalives_count: int = _range(3, 1, 20, "REVIEW_QUEUE_DB_KEEPALIVES_COUNT")
    db_tcp_user_timeout_ms: int = _range(10_000, 1_000, 600_000, "REVIEW_QUEUE_DB_TCP_USER_TIMEOUT_MS")
    # How long a token lookup is cached in each API process; a revoked token stops working
    # within this many seconds.
    token_cache_s: int = _range(5, 0, 300, "REVIEW_QUEUE_TOKEN_CACHE_S")

    # PgBouncer in transaction mode cannot keep server-side prepared statements
    # across transactions; 0 turns psycopg's automatic preparation off.
    prepare_threshold: int = _range(5, 0, 1_000, "REVIEW_QUEUE_PREPARE_THRESHOLD")

    log_format: Literal["json", "text"] = Field(default="json", validation_alias="REVIEW_QUEUE_LOG_FORMAT")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", validation_alias="REVIEW_QUEUE_LOG_LEVEL"
    )
    # Comma-separated origins of the reviewer web UI; none by default.
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias="REVIEW_QUEUE_CORS_ORIGINS"
    )
    metrics_token: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_METRICS_TOKEN")

    # The reviewer desk stops renewing and releases the item (reason "idle") after this long
    # without a key press, click or scroll: a tab left open over a weekend holds no work.
    ui_idle_release_s: int = _range(600, 60, 3600, "REVIEW_QUEUE_UI_IDLE_RELEASE_S")
    # Tests only: a shorter idle release (1-59 s) than the range above allows, so the browser
    # tests can watch it happen; takes precedence when set. Never set it in production.
    ui_idle_release_test_s: int | None = Field(
        default=None, ge=1, le=59, validation_alias="REVIEW_QUEUE_UI_IDLE_RELEASE_TEST_S"
    )

    # Webhooks (docs/integrations.md). Fernet keys (comma-separated: the first encrypts, all
    # decrypt, for rotation) that keep subscription secrets encrypted at rest; unset on the
    # embedded database, `serve` and the deliverer keep one under REVIEW_QUEUE_DATA_DIR.
    webhook_key: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_WEBHOOK_KEY", repr=False)
    webhook_timeout_s: int = _range(10, 1, 60, "REVIEW_QUEUE_WEBHOOK_TIMEOUT_S")
    # Retrying one event stops after this long (Stripe's window): the subscription is then failing.
    webhook_give_up_h: int = _range(72, 1, 720, "REVIEW_QUEUE_WEBHOOK_GIVE_UP_H")
    # Tests only: give up after this many seconds instead; overrides the one above.
    webhook_give_up_test_s: int | None = Field(
        default=None, ge=1, le=3600, validation_alias="REVIEW_QUEUE_WEBHOOK_GIVE_UP_TEST_S"
    )
    # Backoff: the n-th retry waits min(max, base * 2^(n-1)), times a jitter of 0.5-1.
    webhook_retry_base_ms: int = _range(10_000, 100, 600_000, "REVIEW_QUEUE_WEBHOOK_RETRY_BASE_MS")
    webhook_retry_max_s: int = _range(4 * 3600, 1, 24 * 3600, "REVIEW_QUEUE_WEBHOOK_RETRY_MAX_S")
    # Plain http:// receivers (tests, `make run`); production receivers must be https.
    webhook_allow_http: bool = Field(default=False, validation_alias="REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP")
    # Host names and IP addresses or networks a receiver may be at even though they are private,
    # loopback or link-local (SSRF guard); comma-separated.
    webhook_allow_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), validation_alias="REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS"
    )
    # How often an idle deliverer looks for new events, and how many deliveries it runs at once.
    deliverer_interval_ms: int = _range(1_000, 50, 60_000, "REVIEW_QUEUE_DELIVERER_INTERVAL_MS")
    deliverer_concurrency: int = _range(4, 1, 64, "REVIEW_QUEUE_DELIVERER_CONCURRENCY")

    host: str = Field(default="127.0.0.1", validation_alias=AliasChoices("HOST", "REVIEW_QUEUE_HOST"))
    port: int = Field(
        default=8000, ge=1, le=65_535, validation_alias=AliasChoices("PORT", "REVIEW_QUEUE_PORT")
    )
    workers: int = _range(1, 1, 64, "REVIEW_QUEUE_WORKERS")
    # Proxies whose X-Forwarded-For/-Proto uvicorn believes (comma-separated IPs or CIDRs, or "*").
    # Empty: none, so a client cannot choose the address it is logged under.
    forwarded_allow_ips: str = Field(default="", validation_alias="REVIEW_QUEUE_FORWARDED_ALLOW_IPS")

    # Sign-in with the company's OpenID Connect provider (docs/security.md). Unset issuer: off.
    oidc_issuer: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_OIDC_ISSUER")
    # The desk's client; without one, only API calls with the provider's JWTs are accepted.
    oidc_client_id: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_OIDC_CLIENT_ID")
    # None: a public client (PKCE alone).
    oidc_client_secret: SecretStr | None = Field(
        default=None, validation_alias="REVIEW_QUEUE_OIDC_CLIENT_SECRET"
    )
    # The Fernet key that seals a sign-in in progress into its browser's cookie (api/oidc.py).
    # Unset: derived from the client secret; a public client's is random per process.
    oidc_login_key: SecretStr | None = Field(default=None, validation_alias="REVIEW_QUEUE_OIDC_LOGIN_KEY")
    oidc_scopes: str = Field(default="openid profile email", validation_alias="REVIEW_QUEUE_OIDC_SCOPES")
    # The claim whose value (lower-cased) is the reviewer identity, as a token's subject is.
    oidc_subject_claim: str = Field(
        default="preferred_username", min_length=1, validation_alias="REVIEW_QUEUE_OIDC_SUBJECT_CLAIM"
    )
    oidc_roles_claim: str = Field(
        default="groups", min_length=1, validation_alias="REVIEW_QUEUE_OIDC_ROLES_CLAIM"
    )
    oidc_role_map: Annotated[RoleMap, NoDecode] = Field(
        default=(), validation_alias="REVIEW_QUEUE_OIDC_ROLE_MAP"
    )
    # The `aud` of the provider's access tokens for this API (client credentials); unset: none accepted.
    oidc_api_audience: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_OIDC_API_AUDIENCE")
    # "Sign in with <this>" on the desk; unset: the issuer's host name.
    oidc_provider_name: str | None = Field(
        default=None, min_length=1, max_length=60, validation_alias="REVIEW_QUEUE_OIDC_PROVIDER_NAME"
    )
    # Tolerance for the provider's clock in exp, nbf and iat.
    oidc_clock_skew_s: int = _range(60, 0, 300, "REVIEW_QUEUE_OIDC_CLOCK_SKEW_S")
    # The longest a provider's token (ID or access) may claim to live, exp - iat: a token that
    # claims longer is refused, so a provider's mistake (or an exp of 1e300) cannot make one eternal.
    oidc_max_token_lifetime_s: int = _range(86_400, 60, 604_800, "REVIEW_QUEUE_OIDC_MAX_TOKEN_LIFETIME_S")
    # Scripts whose tokens name no person (client credentials): which client acts as which subject.
    # Unlisted, a token without the subject claim is refused rather than named after its client.
    oidc_api_clients: Annotated[ApiClients, NoDecode] = Field(
        default=(), validation_alias="REVIEW_QUEUE_OIDC_API_CLIENTS"
    )
    # The provider's opaque access tokens, checked by RFC 7662 introspection as the desk's client
    # (api/introspection.py): on (1), off (0), or unset: on when the discovery document names an
    # introspection_endpoint and a client secret is set.
    oidc_introspection: bool | None = Field(default=None, validation_alias="REVIEW_QUEUE_OIDC_INTROSPECTION")
    # How long an introspection's answer is reused, never past the token's exp: a revoked token
    # keeps working at most this long. 0: the provider is asked on every call.
    oidc_introspection_cache_s: int = _range(60, 0, 60, "REVIEW_QUEUE_OIDC_INTROSPECTION_CACHE_S")
    # The address people open the service at (https://review.example.com): the OIDC redirect URI is
    # built from it, never from a request's Host header. Required for the desk's OIDC sign-in.
    public_url: str | None = Field(default=None, validation_alias="REVIEW_QUEUE_PUBLIC_URL")

    @field_validator("oidc_role_map", mode="before")
    @classmethod
    def _parse_role_map(cls, value: object) -> object:
        return parse_role_map(value) if isinstance(value, str) else value

    @field_validator("oidc_api_clients", mode="before")
    @classmethod
    def _parse_api_clients(cls, value: object) -> object:
        return parse_api_clients(value) if isinstance(value, str) else value

    @field_validator("oidc_issuer")
    @classmethod
    def _issuer_url(cls, value: str | None) -> str | None:
        # Checked, not rewritten: `iss` must equal it exactly, trailing slash and all (OpenID
        # Connect Discovery 4.3).
        if value is not None:
            web_origin(value, "REVIEW_QUEUE_OIDC_ISSUER", path_allowed=True)
        return value

    @field_validator("public_url")
    @classmethod
    def _public_origin(cls, value: str | None) -> str | None:
        return None if value is None else web_origin(value, "REVIEW_QUEUE_PUBLIC_URL", path_allowed=False)

    @model_validator(mode="after")
    def _oidc_complete(self) -> "Settings":
        # Every message names the variables: a model-level error has no single field to point at.
        given = [
            name
            for name, value in (
                ("REVIEW_QUEUE_OIDC_CLIENT_ID", self.oidc_client_id),
                ("REVIEW_QUEUE_OIDC_CLIENT_SECRET", self.oidc_client_secret),
                ("REVIEW_QUEUE_OIDC_LOGIN_KEY", self.oidc_login_key),
                ("REVIEW_QUEUE_OIDC_ROLE_MAP", self.oidc_role_map),
                ("REVIEW_QUEUE_OIDC_API_AUDIENCE", self.oidc_api_audience),
                ("REVIEW_QUEUE_OIDC_API_CLIENTS", self.oidc_api_clients),
                ("REVIEW_QUEUE_OIDC_INTROSPECTION", self.oidc_introspection),
            )
            if value
        ]
        if self.oidc_issuer is None:
            if given:
                raise ValueError(f"{', '.join(given)} set, but REVIEW_QUEUE_OIDC_ISSUER is not")
            return self
        if not self.oidc_client_id and not self.oidc_api_audience:
            raise ValueError(
                "REVIEW_QUEUE_OIDC_ISSUER needs REVIEW_QUEUE_OIDC_CLIENT_ID (the desk's sign-in),"
                " REVIEW_QUEUE_OIDC_API_AUDIENCE (API calls with the provider's tokens), or both"
            )
        if not self.oidc_role_map:
            raise ValueError(
                "REVIEW_QUEUE_OIDC_ROLE_MAP is required with REVIEW_QUEUE_OIDC_ISSUER: GROUP=ROLE pairs,"
                " e.g. recon-reviewers=reviewer,recon-admins=admin"
            )
        if "openid" not in self.oidc_scopes.split():
            raise ValueError(f"REVIEW_QUEUE_OIDC_SCOPES must include openid: {self.oidc_scopes!r}")
        if self.oidc_client_id and self.public_url is None:
            raise ValueError(
                "REVIEW_QUEUE_PUBLIC_URL is required with REVIEW_QUEUE_OIDC_CLIENT_ID: the address"
                " people open the service at (e.g. https://review.example.com), from which the"
                " redirect URI <it>/auth/oidc/callback is built"
            )
        if (
            self.oidc_client_id
            and not self.oidc_client_secret
            and not self.oidc_login_key
            and self.workers > 1
        ):
            raise ValueError(
                "REVIEW_QUEUE_OIDC_LOGIN_KEY is required for a public client (no"
                " REVIEW_QUEUE_OIDC_CLIENT_SECRET) with REVIEW_QUEUE_WORKERS above 1: every worker must"
                " open the sign-in cookie another sealed (make one with `review-queue webhooks key`)"
            )
        if self.oidc_api_audience is not None and self.oidc_api_audience == self.oidc_client_id:
            raise ValueError(
                "REVIEW_QUEUE_OIDC_API_AUDIENCE must differ from REVIEW_QUEUE_OIDC_CLIENT_ID: an ID"
                " token's audience is the client id, and an ID token must never pass as an API token"
            )
        if self.oidc_introspection and not (
            self.oidc_api_audience and self.oidc_client_id and self.oidc_client_secret
        ):
            raise ValueError(
                "REVIEW_QUEUE_OIDC_INTROSPECTION=1 needs REVIEW_QUEUE_OIDC_API_AUDIENCE (the audience an"
                " opaque token must be for) and REVIEW_QUEUE_OIDC_CLIENT_ID with"
                " REVIEW_QUEUE_OIDC_CLIENT_SECRET (the client that asks the provider about a token)"
            )
        return self

    @property
    def oidc_login_enabled(self) -> bool:
        return self.oidc_issuer is not None and self.oidc_client_id is not None

    @property
    def oidc_display_name(self) -> str:
        return (
            self.oidc_provider_name or urlsplit(self.oidc_issuer or "").hostname or "your identity provider"
        )

    @field_validator("database_url", "migration_database_url", "read_database_url", "listen_database_url")
    @classmethod
    def _postgresql_only(cls, value: str | None) -> str | None:
        # Anything else would fail later, and misleadingly: as a connection error on port 5432.
        if value is not None:
            scheme = value.partition("://")[0].lower() if "://" in value else ""
            if scheme not in POSTGRESQL_SCHEMES:
                raise ValueError(
                    f"must be a PostgreSQL URL (postgresql://user:password@host:port/database), not "
                    f"{scheme + '://' if scheme else 'this'}"
                )
            # Every multi-host spelling libpq reads is taken; one naming no single list of servers is
            # refused here, with its reason, rather than as a traceback from the first connection.
            urls.parse(value)
        return value

    @field_validator("sla_tiers", mode="before")
    @classmethod
    def _parse_tiers(cls, value: object) -> object:
        return parse_sla_tiers(value) if isinstance(value, str) else value

    @property
    def db_liveness(self) -> dict[str, str]:
        """libpq's connection options that bound how long a dead or hung server can hold a caller."""
        return {
            "connect_timeout": str(self.connect_timeout_s),
            "keepalives": "1",
            "keepalives_idle": str(self.db_keepalives_idle_s),
            "keepalives_interval": str(self.db_keepalives_interval_s),
            "keepalives_count": str(self.db_keepalives_count),
            "tcp_user_timeout": str(self.db_tcp_user_timeout_ms),
        }

    @property
    def idle_release_s(self) -> int:
        return self.ui_idle_release_test_s or self.ui_idle_release_s

    @property
    def webhook_give_up_s(self) -> int:
        return self.webhook_give_up_test_s or self.webhook_give_up_h * 3600

    @field_validator("oidc_login_key")
    @classmethod
    def _fernet_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            from cryptography.fernet import Fernet

            try:
                Fernet(value.get_secret_value().strip())
            except ValueError:
                raise ValueError(
                    "must be a Fernet key (32 url-safe base64-encoded bytes); make one with"
                    " `review-queue webhooks key`"
                ) from None
        return value

    @field_validator("webhook_key")
    @classmethod
    def _fernet_keys(cls, value: str | None) -> str | None:
        if value is not None:
            from cryptography.fernet import Fernet

            for key in value.split(","):
                try:
                    Fernet(key.strip())
                except ValueError:
                    raise ValueError(
                        "must be Fernet keys (32 url-safe base64-encoded bytes each, comma-separated);"
                        " make one with `review-queue webhooks key`"
                    ) from None
        return value

    @field_validator("webhook_allow_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = [host.strip().lower() for host in value.split(",") if host.strip()]
        if isinstance(value, list | tuple):
            for host in value:
                if not _ALLOWED_HOST.fullmatch(str(host)):
                    raise ValueError(f"{host!r} is neither a host name nor an IP address or network")
            return tuple(value)
        return value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [origin.strip() for origin in value.split(",") if origin.strip()]
        return value


# A host name, an IPv4 or IPv6 address, or a network in CIDR notation (checked again by ipaddress).
_ALLOWED_HOST = re.compile(r"[a-z0-9.-]{1,253}|[0-9a-f:.]{2,45}(/[0-9]{1,3})?|[0-9.]{7,15}/[0-9]{1,2}")


def hide_password(url: str) -> str:
    """The URL with any password replaced by ***, for messages."""
    return re.sub(r"(://[^/@:]*):[^/@]*@", r"\1:***@", url)


def _explain(error: ValidationError) -> str:
    lines = []
    for err in error.errors():
        if not err["loc"]:  # a rule over several settings: its message names them
            lines.append(f"invalid settings: {err['msg'].removeprefix('Value error, ')}")
            continue
        loc = str(err["loc"][0])
        field = next(
            (f for n, f in Settings.model_fields.items() if loc in (n, f.validation_alias)),
            None,
        )
        env = field.validation_alias if field and isinstance(field.validation_alias, str) else loc
        bounds = ""
        if field is not None:
            lo = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
            hi = next((m.le for m in field.metadata if hasattr(m, "le")), None)
            if lo is not None and hi is not None:
                bounds = f" (allowed range {lo}-{hi})"
        shown = err.get("input")
        if isinstance(shown, str) and str(env).endswith("DATABASE_URL"):
            shown = hide_password(shown)
        lines.append(f"invalid setting {env}={shown!r}: {err['msg']}{bounds}")
    return "\n".join(lines)


def load_settings() -> Settings:
    """Settings from the environment; a bad value stops the process with a message naming it."""
    try:
        return Settings()
    except ValidationError as error:
        raise SystemExit(_explain(error)) from None


@lru_cache
def get_settings() -> Settings:
    return load_settings()
