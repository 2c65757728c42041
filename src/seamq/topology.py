"""The topology: which contexts exist, their streams, DLQ streams and consumers.

A YAML file (the shipped default is SDS-047 §10) becomes typed, validated
objects here. Nothing in this module talks to NATS; `seamq.nats.provision`
turns a Topology into server state.

Consumer names follow ADR-032's `{target}__from_{source}`, so the stream and
filter of a consumer are derived from its name unless given.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Iterable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from seamq.model import BUCKETS, CONSUMER_NAME, ErrorCode, EventSubject, SeamqError, is_name
from seamq.units import parse_duration, parse_size

_STREAM_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The topology as resolved: every value known. What a file may leave out, and what it then is, is
# said once, in the file's shape below (_StreamFile, _ConsumerFile).
class StreamSpec(_Strict):
    name: str
    subjects: tuple[str, ...]
    retention: Literal["limits", "interest", "workqueue"]
    max_age: float  # seconds
    max_bytes: int
    max_msg_size: int
    storage: Literal["file", "memory"]
    replicas: int
    duplicate_window: float  # seconds


class ConsumerSpec(_Strict):
    name: str
    target: str
    source: str
    stream: str
    filter_subject: str
    ack_wait: float  # seconds
    max_deliver: int
    max_ack_pending: int
    partitions: int  # 0: one durable consumer shared by all processes; N: N pinned partitions
    pinned_ttl: float  # seconds without a pull before a partition's pin moves to another process
    replicas: int  # its stream's: a consumer's state must survive what the stream survives

    def fetch_batch(self, wanted: int) -> int:
        """A fetch never asks for more than the server lets one consumer hold unacknowledged."""
        return max(1, min(wanted, self.max_ack_pending))

    def durables(self) -> list[str]:
        """The server's consumers behind this one: itself, or one per partition."""
        return [f"{self.name}-p{k}" for k in range(self.partitions)] if self.partitions else [self.name]

    def partition_filters(self, k: int) -> list[str]:
        """Partition k takes the buckets b with b % partitions == k. Partition 0 also takes events
        published without a bucket (before partitioning, or by a relay with another topology):
        they all land in one partition, in order, rather than nowhere."""
        events = events_pattern(self.filter_subject)
        if self.partitions == 1:
            return [events, f"{events}.*"]
        return [events] * (k == 0) + [f"{events}.b{b}" for b in range(k, BUCKETS, self.partitions)]


def events_pattern(filter_subject: str) -> str:
    """`{src}.event.>` -> `{src}.event.*.*`: the filter as exactly the four tokens of an event subject."""
    tokens = filter_subject.split(".")
    if tokens[-1] == ">":
        tokens = tokens[:-1] + ["*"] * (4 - len(tokens) + 1)
    if len(tokens) != 4 or ">" in tokens:
        raise ValueError(f"filter_subject {filter_subject!r} must name events ({{source}}.event.{{name}}.v{{n}}, "
                         "wildcards allowed) to be partitioned")
    return ".".join(tokens)


class ContextSpec(_Strict):
    name: str
    stream: StreamSpec
    dlq: StreamSpec


class Route(_Strict):
    """A context of a part of seamq whose rows are not domain events: each goes to one subject, on a
    stream that part provisions (the job server's intake). The part registers it at load."""
    context: str
    subject: str
    stream: str
    owner: str  # whose the context is, for a file that declares it


class Topology(_Strict):
    contexts: dict[str, ContextSpec]
    consumers: dict[str, ConsumerSpec]
    routes: dict[str, Route] = {}
    source: str = "<memory>"

    def partitioned(self, context: str) -> bool:
        """Do the events of `context` carry their aggregate's bucket (some consumer of them is partitioned)?"""
        return any(c.partitions and c.source == context for c in self.consumers.values())

    def event_subject(self, context: str, event_type: str, version: int, bucket: int) -> str:
        """The subject an event is published on: REQ-057's, plus `.b{bucket}` in a partitioned context."""
        subject = EventSubject(context, event_type, version)
        return subject.routed(bucket) if self.partitioned(context) else str(subject)

    def destination(self, context: str, event_type: str, version: int, bucket: int) -> tuple[str, str]:
        """(subject, stream) an outbox row of `context` is published to: every context's one rule."""
        if route := self.routes.get(context):
            return route.subject, route.stream
        subject = self.event_subject(context, event_type, version, bucket)
        if context not in self.contexts:
            raise SeamqError(ErrorCode.INVALID_TOPOLOGY, f"context {context!r} has no stream in the topology")
        return subject, self.contexts[context].stream.name

    def streams(self) -> list[StreamSpec]:
        return [s for ctx in self.contexts.values() for s in (ctx.stream, ctx.dlq)]

    def consumer(self, name: str) -> ConsumerSpec:
        try:
            return self.consumers[name]
        except KeyError:
            known = ", ".join(sorted(self.consumers)) or "none"
            raise SeamqError(
                ErrorCode.INVALID_TOPOLOGY, f"{self.source}: no consumer {name!r} (known: {known})"
            ) from None

    def dlq_stream(self, consumer: str) -> str:
        """The stream that holds this consumer's dead letters: its own context's."""
        return self.contexts[self.consumer(consumer).target].dlq.name


# The YAML shape: contexts: {name: {stream: {...}, dlq: {...}}}, consumers: {name: {...}}.
# Units are parsed here, so a bad value is reported at its own key.
class _StreamFile(_Strict):
    name: str | None = None
    retention: Literal["limits", "interest", "workqueue"] = "limits"
    max_age: float = 7 * 86400
    max_bytes: int = -1
    max_msg_size: int = -1
    storage: Literal["file", "memory"] = "file"
    replicas: int | None = Field(None, ge=1, le=5)
    duplicate_window: float = 120

    _durations = field_validator("max_age", "duplicate_window", mode="before")(lambda v: parse_duration(v))
    _sizes = field_validator("max_bytes", "max_msg_size", mode="before")(lambda v: parse_size(v))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _STREAM_NAME.match(value):
            raise ValueError(f"stream name {value!r} must be UPPER_SNAKE_CASE")
        return value

    @model_validator(mode="after")
    def _window(self) -> "_StreamFile":
        if self.max_age and self.duplicate_window > self.max_age:
            raise ValueError("duplicate_window must not exceed max_age")
        return self


class _ContextFile(_Strict):
    stream: _StreamFile = _StreamFile()
    dlq: _StreamFile = _StreamFile(max_age=30 * 86400)


MAX_DELIVER = 20  # a consumer's deliveries of one message, unless its topology says otherwise (the testing kit's too)


class _ConsumerFile(_Strict):
    stream: str | None = None
    filter_subject: str | None = None
    ack_wait: float = 120
    max_deliver: int = Field(MAX_DELIVER, ge=1)
    max_ack_pending: int = Field(50, ge=1)
    partitions: int = Field(0, ge=0, le=BUCKETS)
    pinned_ttl: float = Field(10, ge=3)  # a pinned process renews its pull every ~2 s (nats.pull.EXPIRES)

    _durations = field_validator("ack_wait", "pinned_ttl", mode="before")(lambda v: parse_duration(v))


class _Defaults(_Strict):
    replicas: int = Field(1, ge=1, le=5)


class _TopologyFile(_Strict):
    defaults: _Defaults = _Defaults()
    contexts: dict[str, _ContextFile]
    consumers: dict[str, _ConsumerFile] = {}

    @field_validator("contexts")
    @classmethod
    def _context_names(cls, value: dict) -> dict:
        for name in value:
            if not is_name(name):
                raise ValueError(f"context name {name!r} must be lowercase snake_case")
        if not value:
            raise ValueError("at least one context is required")
        return value


def _build(raw: _TopologyFile, source: str, replicas: int | None, routes: dict[str, Route]) -> Topology:
    def stream(spec: _StreamFile, name: str, subject: str) -> StreamSpec:
        return StreamSpec(**{**spec.model_dump(), "name": spec.name or name, "subjects": (subject,),
                             "replicas": replicas or spec.replicas or raw.defaults.replicas})

    contexts = {
        name: ContextSpec(
            name=name,
            stream=stream(ctx.stream, f"{name.upper()}_EVENTS", f"{name}.event.>"),
            dlq=stream(ctx.dlq, f"{name.upper()}_DLQ", f"{name}.dlq.>"),
        )
        for name, ctx in raw.contexts.items()
    }
    consumers = {}
    for name, spec in raw.consumers.items():
        match = CONSUMER_NAME.match(name)
        if not match:
            raise _KeyError(("consumers", name), "consumer name must be {target}__from_{source}")
        target, src = match[1], match[2]
        for role, ctx in (("target", target), ("source", src)):
            if ctx not in contexts:
                raise _KeyError(("consumers", name), f"{role} context {ctx!r} is not declared under contexts")
        stream_name = spec.stream or contexts[src].stream.name
        if stream_name not in {c.stream.name for c in contexts.values()}:
            raise _KeyError(("consumers", name, "stream"), f"no stream named {stream_name!r}")
        filter_subject = spec.filter_subject or f"{src}.event.>"
        if not filter_subject.startswith(f"{src}.event."):
            raise _KeyError(
                ("consumers", name, "filter_subject"), f"must lie within {src}.event.> (the source stream)"
            )
        consumers[name] = ConsumerSpec(**{
            **spec.model_dump(), "name": name, "target": target, "source": src, "stream": stream_name,
            "filter_subject": filter_subject,
            "replicas": next(c.stream.replicas for c in contexts.values() if c.stream.name == stream_name)})
        if spec.partitions:
            try:
                events_pattern(filter_subject)
            except ValueError as exc:
                raise _KeyError(("consumers", name, "filter_subject"), str(exc)) from None
    for route in routes.values():
        if route.context in contexts:
            raise _KeyError(("contexts", route.context), f"context name {route.context!r} is {route.owner}")
    names = [s.name for c in contexts.values() for s in (c.stream, c.dlq)] + [r.stream for r in routes.values()]
    if len(set(names)) != len(names):
        raise _KeyError(("contexts",), f"stream names must be unique, got {sorted(names)}")
    return Topology(contexts=contexts, consumers=consumers, routes=routes, source=source)


class _KeyError(Exception):
    def __init__(self, loc: tuple, reason: str) -> None:
        self.loc, self.reason = loc, reason


def load_topology(path: Path | str | None = None, *, replicas: int | None = None,
                  routes: Iterable[Route] = ()) -> Topology:
    """Load and validate a topology file (the shipped default when None), with the routes of the
    parts of seamq in use (`seamq.jobs.route`), whose contexts a file may not take.

    Errors name the file, the dotted key and the reason, with the
    INVALID_TOPOLOGY code; the CLI exits 2 on them.
    """
    if path is None:
        text = resources.files("seamq").joinpath("default_topology.yaml").read_text()
        source = "default_topology.yaml"
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SeamqError(ErrorCode.INVALID_TOPOLOGY, f"{source}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SeamqError(ErrorCode.INVALID_TOPOLOGY, f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SeamqError(ErrorCode.INVALID_TOPOLOGY, f"{source}: the top level must be a mapping")
    try:
        return _build(_TopologyFile.model_validate(data), source, replicas, {r.context: r for r in routes})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise _topology_error(source, tuple(err["loc"]), err["msg"]) from None
    except _KeyError as exc:
        raise _topology_error(source, exc.loc, exc.reason) from None


def _topology_error(source: str, loc: tuple, reason: str) -> SeamqError:
    key = ".".join(str(part) for part in loc) or "<root>"
    reason = reason.removeprefix("Value error, ")
    return SeamqError(ErrorCode.INVALID_TOPOLOGY, f"{source}: {key}: {reason}")


def inbox_retention_floor(topology: Topology, *, nak_max: float, replay_window: float = 0.0) -> float:
    """How long processed inbox rows must be kept, in seconds.

    A copy of a message can still arrive as long as JetStream may redeliver
    it (every delivery can wait out ack_wait or a NAK delay), as long as a
    publisher may republish it inside the duplicate window, and as long as
    the DLQ replay may bring it back. Purging a row earlier would let that
    copy be processed a second time.
    """
    window = max(s.duplicate_window for s in topology.streams())
    return window + redelivery_window(topology, nak_max) + replay_window


def inbox_retention(topology: Topology, seconds: float, what: str, *, nak_max: float, replay_window: float) -> float:
    """`seconds` of inbox retention, refused (INVALID_CONFIG, naming `what`) when a copy of a message
    may still arrive after its row is gone, and so be handled twice."""
    floor = inbox_retention_floor(topology, nak_max=nak_max, replay_window=replay_window)
    if seconds <= floor:
        raise SeamqError(ErrorCode.INVALID_CONFIG, (
            f"{what} is too short: a copy of a message may still arrive up to {floor:g}s (duplicate window + "
            "max_deliver x max(ack_wait, NAK delay) + DLQ replay window) after it was first seen; purging sooner "
            "could handle it twice"))
    return seconds


def redelivery_window(topology: Topology, nak_max: float) -> float:
    """The longest JetStream may take to hand a message to a consumer for the last time: every
    delivery may wait out ack_wait or the longest NAK delay."""
    return max((c.max_deliver * max(c.ack_wait, nak_max) for c in topology.consumers.values()), default=0.0)
