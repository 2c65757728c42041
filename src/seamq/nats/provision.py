"""Make the server's streams and consumers match the topology, or say why not.

`plan()` compares the topology with what the server has and returns one
Change per stream and consumer; `apply()` carries the plan out. Changes that
would drop or orphan data (storage type, retention, removed subjects, a
consumer's ack policy) are marked destructive and refused unless forced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig,
)
from nats.js.errors import NotFoundError

from seamq.model import ErrorCode, SeamqError
from seamq.topology import ConsumerSpec, StreamSpec, Topology


@dataclass
class Change:
    kind: str  # "stream" | "consumer"
    name: str
    action: str  # "create" | "update" | "recreate" | "unchanged"
    diffs: list[tuple[str, Any, Any]] = field(default_factory=list)  # (field, server, desired)
    destructive_reasons: list[str] = field(default_factory=list)
    stream: str | None = None  # for consumers

    @property
    def destructive(self) -> bool:
        return bool(self.destructive_reasons)


def stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        retention=RetentionPolicy(spec.retention),
        max_age=spec.max_age,
        max_bytes=spec.max_bytes,
        max_msg_size=spec.max_msg_size,
        storage=StorageType(spec.storage),
        num_replicas=spec.replicas,
        duplicate_window=spec.duplicate_window,
    )


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.name,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        filter_subject=spec.filter_subject,
    )


def _value(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def _diff(server: Any, desired: Any, fields: list[str]) -> list[tuple[str, Any, Any]]:
    out = []
    for name in fields:
        have, want = _value(getattr(server, name)), _value(getattr(desired, name))
        if isinstance(want, float) and have is not None and abs(float(have) - want) < 1e-3:
            continue
        if isinstance(want, list):
            have, want = sorted(have or []), sorted(want)
        if have != want:
            out.append((name, have, want))
    return out


_STREAM_FIELDS = [
    "subjects", "retention", "max_age", "max_bytes", "max_msg_size", "storage", "num_replicas",
    "duplicate_window",
]
_CONSUMER_FIELDS = [
    "ack_policy", "deliver_policy", "ack_wait", "max_deliver", "max_ack_pending", "filter_subject",
]


async def plan(js: JetStreamContext, topology: Topology) -> list[Change]:
    changes = []
    for spec in topology.streams():
        desired = stream_config(spec)
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            changes.append(Change("stream", spec.name, "create"))
            continue
        diffs = _diff(info.config, desired, _STREAM_FIELDS)
        reasons = []
        for name, have, want in diffs:
            if name in ("storage", "retention"):
                reasons.append(f"{name} {have} -> {want} needs the stream deleted and recreated")
            if name == "subjects" and set(have) - set(want) and info.state.messages:
                reasons.append(f"removing subjects {sorted(set(have) - set(want))} orphans stored messages")
        action = "unchanged" if not diffs else ("recreate" if any("recreated" in r for r in reasons) else "update")
        changes.append(Change("stream", spec.name, action, diffs, reasons))
    for spec in topology.consumers.values():
        desired = consumer_config(spec)
        try:
            info = await js.consumer_info(spec.stream, spec.name)
        except NotFoundError:
            changes.append(Change("consumer", spec.name, "create", stream=spec.stream))
            continue
        diffs = _diff(info.config, desired, _CONSUMER_FIELDS)
        reasons = [
            f"{name} {have} -> {want} needs the consumer recreated, losing its delivery state"
            for name, have, want in diffs if name in ("ack_policy", "deliver_policy")
        ]
        action = "unchanged" if not diffs else ("recreate" if reasons else "update")
        changes.append(Change("consumer", spec.name, action, diffs, reasons, stream=spec.stream))
    return changes


async def apply(js: JetStreamContext, topology: Topology, *, force: bool = False) -> list[Change]:
    """Plan, refuse destructive changes unless forced, then carry the plan out."""
    changes = await plan(js, topology)
    refused = [c for c in changes if c.destructive and not force]
    if refused:
        lines = "; ".join(f"{c.kind} {c.name}: {', '.join(c.destructive_reasons)}" for c in refused)
        raise SeamqError(ErrorCode.DESTRUCTIVE_CHANGE, f"{lines} (rerun with --force to accept data loss)")
    streams = {s.name: s for s in topology.streams()}
    consumers = topology.consumers
    for change in changes:
        if change.kind == "stream":
            config = stream_config(streams[change.name])
            if change.action == "create":
                await js.add_stream(config)
            elif change.action == "update":
                await js.update_stream(config)
            elif change.action == "recreate":
                await js.delete_stream(change.name)
                await js.add_stream(config)
    for change in changes:
        if change.kind == "consumer" and change.action != "unchanged":
            spec = consumers[change.name]
            if change.action == "recreate":
                await js.delete_consumer(spec.stream, spec.name)
            # add_consumer with an existing durable name updates it in place.
            await js.add_consumer(spec.stream, consumer_config(spec))
    return changes
