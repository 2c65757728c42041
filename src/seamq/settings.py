"""Typed settings from `SEAMQ_*` environment variables and an optional YAML file.

Precedence, highest first: explicit keyword arguments, environment, the YAML
file (`SEAMQ_CONFIG` or `--config`), defaults. Secrets are `SecretStr`, so
they print as `**********` in logs, reprs and `--help`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, Field, PositiveFloat, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from seamq.backoff import Backoff
from seamq.dead_letter import ReplayPolicy
from seamq.model import ErrorCode, SeamqError
from seamq.redact import ShortSecret, conninfo_password, redact, register, url_password


class NatsSettings(BaseModel):
    url: str = Field("nats://127.0.0.1:4222", description="one server, or a cluster's: a list or comma-separated")
    user: str | None = Field(None, description="user name, with password")
    password: SecretStr | None = Field(None, description="password for user (never shown in any output)")
    token: SecretStr | None = Field(None, description="authentication token, instead of user and password")
    creds_file: Path | None = Field(None, description="a .creds file (JWT and NKey seed), for NATS accounts")
    nkey_seed_file: Path | None = Field(None, description="a file holding an NKey seed")
    tls_ca: Path | None = Field(None, description="CA certificate to verify the servers with (tls://)")
    tls_cert: Path | None = Field(None, description="client certificate, for servers that ask for one")
    tls_key: Path | None = Field(None, description="the client certificate's key")
    connect_timeout: float = Field(2.0, gt=0, description="seconds one connection attempt may take: a server cut "
                                   "off costs a reconnect this long before the next one is tried")
    startup_wait: float = Field(5.0, gt=0, description="seconds a worker waits for NATS at start before it exits "
                                                       "with error[BROKER_UNAVAILABLE] (its supervisor restarts it)")
    # A server that stops answering without closing the connection (a frozen or partitioned host)
    # is left when a third ping is due with two unanswered: 4 to 6 s after its last answer at 2 s.
    # nats-py's default, 120 s, held a relay on a frozen cluster node for over 5 minutes, and 5 s
    # stopped publishing for 28 s when a node was cut off (tests/cluster/messaging/test_network_partitions.py); see
    # docs/operations.md, "A NATS cluster".
    ping_interval: float = Field(2.0, gt=0, description="seconds between pings; a third due with two unanswered: "
                                                        "reconnect elsewhere")

    @field_validator("creds_file", "nkey_seed_file", "tls_ca", "tls_cert", "tls_key")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        """Said at start, not as a connection failure later (a missing CA file looked like an
        unreachable broker)."""
        if value is not None and not (value.is_file() and os.access(value, os.R_OK)):
            raise ValueError(f"{value} is not a readable file")
        return value

    @field_validator("url", mode="before")
    @classmethod
    def _servers(cls, value: Any) -> Any:
        """A cluster's servers as a YAML list, or comma-separated (as in SEAMQ_NATS__URL)."""
        return ",".join(value) if isinstance(value, (list, tuple)) else value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        for server in value.split(","):
            register(url_password(server))
            if urlsplit(server.strip()).scheme not in ("nats", "tls", "ws", "wss"):
                raise ValueError(f"{redact(server.strip())!r} is not a nats://, tls://, ws:// or wss:// URL")
        return value


class RelaySettings(BaseModel):
    batch_size: int = Field(500, ge=1, le=10_000, description="outbox rows one claim takes")
    loops: int = Field(2, ge=1, le=16, description="claim loops per relay process (overlap PG and NATS work)")
    poll_interval: float = Field(1.0, gt=0, description="seconds between polls when NOTIFY is quiet")
    publish_timeout: float = Field(5.0, gt=0, description="seconds to wait for JetStream's acks of a batch")
    max_backoff: float = Field(30.0, gt=0, description="longest wait, seconds, after NATS or PostgreSQL failed")
    backlog_interval: float = Field(5.0, gt=0, description="seconds between outbox backlog gauge updates")
    purge_older_than: str | None = Field(None, description="e.g. 7d: purge published rows on a timer")

    @field_validator("purge_older_than")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            from seamq.units import parse_duration

            parse_duration(value)
        return value


class ConsumerSettings(BaseModel):
    batch_size: int = Field(50, ge=1, le=10_000, description="capped by the consumer's max_ack_pending")
    fetch_timeout: float = Field(1.0, gt=0, description="seconds one pull waits for messages")
    concurrency: int = Field(4, ge=1, le=256, description="lanes: transactions in flight at once (HTTP handlers: more)")
    ordered: bool = Field(True, description="one aggregate's messages one after another")
    alone: bool | None = Field(None, description="the only process of its (unpartitioned) consumer, so a gap in "
                               "its deliveries is a loss, held for; unset: the processes count each other "
                               "(docs/operations.md, A NATS cluster)")
    handler_timeout: float = Field(10.0, gt=0, description="seconds a handler call may take; then it is a retry")
    handler_url: str | None = Field(None, description="HTTP handler for every event without a route")
    handler_secret: SecretStr | None = Field(None, description="HMAC secret shared with handler services")
    registry: str | None = Field(None, description="import path of a Registry, e.g. myapp.registry:REGISTRY")
    inbox: bool = Field(True, description="false: at-least-once, no inbox (handlers must be idempotent)")
    nak_base: float = Field(1.0, gt=0, description="first redelivery delay after a failure, seconds")
    nak_max: float = Field(60.0, gt=0, description="longest redelivery delay after failures, seconds")
    lane_batch: int = Field(100, ge=1, le=10_000, description="most messages one lane transaction takes")
    purge_older_than: str | None = Field(None, description="e.g. 30d: drop processed inbox rows on a timer")

    _duration = field_validator("purge_older_than")(classmethod(lambda cls, v: RelaySettings._duration(v)))


class ReplaySettings(BaseModel):
    base_delay: float = Field(5.0, gt=0, description="delay before the first replay, seconds")
    factor: float = Field(2.0, ge=1, description="each automatic replay waits this many times the last")
    max_delay: float = Field(300.0, gt=0, description="longest delay between automatic replays, seconds")
    max_attempts: int = Field(5, ge=0, description="automatic replays of a dead letter; then it is exhausted")
    jitter: float = Field(0.5, ge=0, le=1, description="delay x [1 - jitter, 1]")
    # Not handler_rejected: a Poison says the message can never succeed (docs/operations.md, Replay).
    reasons: list[str] = Field(["max_deliver"], description="replayable dead-letter reasons")
    interval: float = Field(1.0, gt=0, description="seconds between replay rounds")

    @property
    def window(self) -> float:
        """The longest the automatic replay may bring a message back after it was dead-lettered."""
        return self.max_delay * self.max_attempts

    def policy(self):
        return ReplayPolicy(Backoff(base=self.base_delay, cap=self.max_delay, factor=self.factor,
                                    spread=(1 - self.jitter, 1.0)),
                            max_attempts=self.max_attempts, reasons=tuple(self.reasons))


class AuditSettings(BaseModel):
    """`seamq audit` (docs/operations.md, "The audit")."""

    interval: float = Field(10.0, gt=0, description="seconds between rounds once every walk has caught up")
    lookback: float = Field(3600.0, gt=0, description="seconds back a walk starts the first time it runs")
    settle: float = Field(150.0, ge=0, description="seconds a published row waits before it is audited: longer than "
                          "JetStream's sync interval (2 min by default), so that a power loss is found")
    page: int = Field(5000, ge=100, le=100_000, description="rows or messages one walk takes per round")
    repair: bool = Field(True, description="publish again what is missing from a stream, from its outbox row")


class PipelineSettings(BaseModel):
    """Where `seamq pipeline ...` runs its Spark jobs (docs/deploy.md, "Spark")."""

    master: str = Field("local[*]", description="local[*], spark://host:7077, yarn, k8s://...; --master overrides")
    driver_host: str | None = Field(None, description="the address executors reach the driver at (cluster masters)")
    driver_bind_address: str | None = Field(None, description="the address the driver listens on (cluster masters)")
    executor_python: str = Field("python3", description="the executors' Python (PYSPARK_PYTHON), not the driver's")
    conf: dict[str, str] = Field({}, description="more Spark settings, e.g. spark.archives, spark.executor.memory")


class JobsSettings(BaseModel):
    """The job server (`seamq jobs serve`) and its clients (`seamq jobs worker`, `list`, ...)."""

    url: str = Field("http://127.0.0.1:8080", description="the job server, for the commands that call it")
    tokens: SecretStr | None = Field(None, description="bearer tokens that may do anything, comma-separated "
                                                       "(several: rotate without downtime); clients send the first")
    read_tokens: SecretStr | None = Field(None, description="bearer tokens that may only read, comma-separated")
    replicas: int | None = Field(None, ge=1, le=5, description="copies of the job streams and buckets in a NATS "
                                                             "cluster; default 3 in a cluster of 3 or more, else 1")
    encryption_keys: SecretStr | None = Field(None, description="id:key (32 bytes, base64), comma-separated: "
                                              "jobs pushed by seamq's client are sealed with the first, a worker "
                                              "opens jobs sealed with any (docs/jobs.md, Encrypted args)")
    webhook_private_addresses: bool = Field(False, description="deliver webhooks to loopback, private and link-local "
                                                               "addresses too (receivers inside your network); off, "
                                                               "a subscription cannot reach into it")
    webhook_retry_delays: tuple[PositiveFloat, ...] = Field(
        (30.0, 120.0, 600.0, 3600.0, 14400.0, 43200.0, 86400.0), min_length=1, max_length=20,
        description="seconds before each retry of a webhook delivery, as JSON ([30, 120, ...]); the OJS spec's by default")

    @field_validator("tokens", "read_tokens", "encryption_keys")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        for token in (value.get_secret_value() if value else "").split(","):
            if token.strip():
                register(token.strip())  # never in any output (seamq.redact)
                if ":" in token:  # an encryption key's own part
                    register(token.strip().partition(":")[2])
        return value

    def client_token(self) -> str | None:
        """What seamq's own clients send: the first full token, else the first read token."""
        for given in (self.tokens, self.read_tokens):
            first = next((t.strip() for t in (given.get_secret_value() if given else "").split(",") if t.strip()), None)
            if first:
                return first
        return None


class ConsoleSettings(BaseModel):
    """The web console (`seamq console`, docs/console.md)."""

    host: str = Field("127.0.0.1", description="address to listen on; beyond loopback only with users set")
    port: int = Field(8090, ge=0, le=65535, description="port to listen on")
    users: SecretStr | None = Field(None, description="who may sign in: name:password:role, comma-separated; "
                                                      "role admin (may act) or viewer (may only look)")
    session_secret: SecretStr | None = Field(None, description="signs session cookies; default a random one per "
                                                               "start (everyone signs in again after a restart)")
    session_hours: float = Field(12, gt=0, description="how long a sign-in lasts")

    @field_validator("users")
    @classmethod
    def _passwords(cls, value: SecretStr | None) -> SecretStr | None:
        for _, password, _ in console_users(value.get_secret_value() if value else None):
            register(password)  # never in any output (seamq.redact)
        return value

    @field_validator("session_secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        register(value.get_secret_value() if value else None)
        return value


def console_users(text: str | None) -> list[tuple[str, str, str]]:
    """`name:password:role,...` as (name, password, role); without a role, admin. A password may hold
    colons: the role is what follows the last one."""
    out = []
    for entry in (text or "").split(","):
        if entry.strip():
            name, _, rest = entry.strip().partition(":")
            password, _, role = rest.rpartition(":") if ":" in rest else (rest, "", "admin")
            out.append((name, password, role or "admin"))
    return out


class EmbeddedSettings(BaseModel):
    """The services `seamq dev` starts when no external ones are configured."""

    data_dir: Path = Field(Path(".seamq"), description="where the embedded services keep their data")
    nats_port: int | None = Field(None, ge=1, le=65535, description="nats-server's port; unset: 4222 when free, "
                                  "else a free one; set: that port, or PORT_IN_USE")
    pg_port: int | None = Field(None, ge=1, le=65535, description="PostgreSQL's port; unset: 5432 when free, else a "
                                "free one; set: that port, or PORT_IN_USE")
    # JetStream fsync: "default" syncs every 2 minutes (fast, can lose acked
    # writes on power loss); "always" fsyncs every message. See docs/operations.md.
    nats_sync: Literal["default", "always"] = Field("default", description="JetStream fsync of the embedded "
                                                    "nats-server: every 2 minutes (default), or every message")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SEAMQ_", env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    database_url: SecretStr | None = Field(None, description="PostgreSQL: postgresql://user:password@host:port/"
                                           "dbname, or libpq key=value pairs")
    nats: NatsSettings = NatsSettings()
    topology_file: Path | None = Field(None, description="the topology YAML; default the shipped SDS-047 one")
    replicas: int | None = Field(None, ge=1, le=5, description="overrides every stream's replicas")
    relay: RelaySettings = RelaySettings()
    consumer: ConsumerSettings = ConsumerSettings()
    replay: ReplaySettings = ReplaySettings()
    audit: AuditSettings = AuditSettings()
    registry_manifests: Path = Field(Path("manifests"), description="the handler registry's manifests folder")
    registry_module: Path = Field(Path("registry_generated.py"), description="the module `seamq registry "
                                  "generate` writes")
    embedded: EmbeddedSettings = EmbeddedSettings()
    jobs: JobsSettings = JobsSettings()
    console: ConsoleSettings = ConsoleSettings()
    pipeline: PipelineSettings = PipelineSettings()
    log_level: str = Field("info", description="debug, info, warning or error")
    metrics_port: int | None = Field(None, description="serve /metrics, /healthz and /readyz on this port")
    metrics_host: str = Field("127.0.0.1", description="address to serve them on; 0.0.0.0 for a scraper elsewhere")
    health_stale_after: float = Field(60.0, gt=0, description="/healthz fails when a loop is busy this long")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls), file_secret_settings)

    @field_validator("database_url")
    @classmethod
    def _dsn(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        dsn = value.get_secret_value()
        register(url_password(dsn) or conninfo_password(dsn))
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(dsn)
        except Exception:  # libpq's message quotes the string, password and all
            raise ValueError(
                "not a PostgreSQL connection string: expected postgresql://user:password@host:port/dbname "
                "(percent-encode spaces and other special characters in the password) or libpq key=value pairs"
            ) from None
        return value

    @model_validator(mode="after")
    def _liveness_outlasts_a_handler(self) -> "Settings":
        if self.health_stale_after <= self.consumer.handler_timeout:
            raise ValueError(f"health_stale_after ({self.health_stale_after:g}s) must exceed consumer.handler_timeout "
                             f"({self.consumer.handler_timeout:g}s): a slow handler is not a hung process")
        return self

    def database_dsn(self) -> str:
        if self.database_url is None:
            raise SeamqError(ErrorCode.INVALID_CONFIG, "no database configured: set SEAMQ_DATABASE_URL")
        return self.database_url.get_secret_value()


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the file named by SEAMQ_CONFIG, if any."""

    def get_field_value(self, field, field_name):  # pragma: no cover - unused by __call__
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("SEAMQ_CONFIG")
        if not path:
            return {}
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{path}: cannot read config: {exc}") from None
        if not isinstance(data, dict):
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{path}: the top level must be a mapping")
        return data


def load_settings(**overrides: Any) -> Settings:
    """Settings, or a SeamqError that names each bad key. Every secret is registered
    with seamq.redact first, so that nothing printed afterwards can show it."""
    for key, value in os.environ.items():
        key = key.upper()
        if key.startswith("SEAMQ_") and key.endswith(("PASSWORD", "TOKEN", "SECRET", "_URL")):
            _register(key, value if not key.endswith("_URL") else url_password(value) or conninfo_password(value))
    try:
        settings = Settings(**overrides)
    except SettingsError as exc:  # a value the environment holds that is not the JSON a list or mapping needs
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"a SEAMQ_{field.upper()}__... variable: {exc.__cause__ or exc} "
                                                   "(a list or a mapping is written as JSON: docs/settings.md)") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SeamqError(ErrorCode.INVALID_CONFIG, redact(problems)) from None
    for key, value in (("nats.password", settings.nats.password), ("nats.token", settings.nats.token),
                       ("consumer.handler_secret", settings.consumer.handler_secret)):
        _register(key, value.get_secret_value() if value else None)
    return settings


def _register(key: str, secret: str | None) -> None:
    try:
        register(secret)
    except ShortSecret as exc:
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"{key}: {exc}") from None


def reference() -> str:
    """Every setting a user can set, as docs/settings.md shows them: generated from the model, so the
    page cannot drift from what seamq reads (tests/integration/product/test_settings.py compares them)."""
    rows = ["| variable | default | what it is |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            nested = next((a for a in (get_args(field.annotation) or (field.annotation,))
                           if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if nested is not None:
                walk(nested, f"{prefix}{name.upper()}__")
                continue
            default = field.get_default(call_default_factory=True)
            if isinstance(default, bool):
                default = str(default).lower()
            elif isinstance(default, list):
                default = ",".join(default)
            shown = "-" if default in (None, {}, "") else f"`{default}`"
            rows.append(f"| `{prefix}{name.upper()}` | {shown} | {field.description} |")

    walk(Settings, "SEAMQ_")
    return "\n".join(rows) + "\n"


def redact_url(url: str) -> str:
    """A URL with its password replaced, for printing."""
    return redact(url)
