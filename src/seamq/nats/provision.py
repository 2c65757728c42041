"""Make the server's streams and consumers match the topology, or say why not.

`plan()` compares the topology with what the server has and returns one
Change per stream and consumer; `apply()` carries the plan out. Changes that
would drop or orphan data (storage type, retention, removed subjects, a
consumer's ack policy) are marked destructive and refused unless forced.

A partitioned consumer is one server consumer per partition (seamq.nats.partitions),
in a pinned priority group, which nats-py's ConsumerConfig cannot express: they
are made through the JetStream API directly. Changing a consumer's partitions
(from none, or to another number) is a migration: refused unless asked for, and
then done only while no process pulls it (see `migrate_partitions`).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from seamq.model import ErrorCode, SeamqError
from seamq.nats import jsapi
from seamq.nats.fast_batch import server_batches
from seamq.nats.partitions import GROUP
from seamq.topology import ConsumerSpec, StreamSpec, Topology, events_pattern

# JetStream's "no suitable peers for placement" and "insufficient resources": a server of the
# cluster is down, not yet joined, or full; the topology itself is fine.
PLACEMENT_REFUSED = {10005, 10023}


@dataclass
class Change:
    kind: str  # "stream" | "consumer"
    name: str
    action: str  # "create" | "update" | "recreate" | "unchanged" | "migrate" (partitions changed)
    diffs: list[tuple[str, Any, Any]] = field(default_factory=list)  # (field, server, desired)
    destructive_reasons: list[str] = field(default_factory=list)
    stream: str | None = None  # for consumers

    @property
    def destructive(self) -> bool:
        return bool(self.destructive_reasons)


def stream_config(spec: StreamSpec, *, batched: bool = False) -> StreamConfig:
    """`batched`: the server has fast batch publishing (seamq.nats.fast_batch); event streams allow it."""
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
        allow_batched=True if batched else None,  # None: not sent, for servers that do not know it
    )


# JetStream's own delivery limit stays off: past it, the server stops delivering a message in
# silence. seamq counts the handler's attempts in the inbox and dead-letters on the last one
# (seamq.verdict); holds, crashes and broker restarts cost no attempt. `max_deliver` is that count.
DELIVER_FOREVER = -1


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.name,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait,
        max_deliver=DELIVER_FOREVER,
        max_ack_pending=spec.max_ack_pending,
        filter_subject=spec.filter_subject,
        num_replicas=spec.replicas,
    )


def _value(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def _diff(server: Any, desired: Any, fields: list[str]) -> list[tuple[str, Any, Any]]:
    out = []
    for name in fields:
        have, want = _value(getattr(server, name)), _value(getattr(desired, name))
        if name == "allow_batched":
            have, want = bool(have), bool(want)
        if isinstance(want, float) and have is not None and abs(float(have) - want) < 1e-3:
            continue
        if isinstance(want, list):
            have, want = sorted(have or []), sorted(want)
        if have != want:
            out.append((name, have, want))
    return out


_STREAM_FIELDS = [
    "subjects", "retention", "max_age", "max_bytes", "max_msg_size", "storage", "num_replicas",
    "duplicate_window", "allow_batched",
]
_CONSUMER_FIELDS = [
    "ack_policy", "deliver_policy", "ack_wait", "max_deliver", "max_ack_pending", "filter_subject", "num_replicas",
]
_PARTITION_FIELDS = ["ack_wait", "max_deliver", "max_ack_pending", "filter_subjects", "priority_timeout",
                     "num_replicas"]
_MIGRATE = "stop every `seamq consume` of it, then run `seamq provision --migrate-partitions`"


def partition_config(spec: ConsumerSpec, k: int) -> dict[str, Any]:
    """Partition k of a partitioned consumer, as the JetStream API takes it."""
    return {
        "durable_name": spec.durables()[k], "deliver_policy": "all", "ack_policy": "explicit",
        "ack_wait": int(spec.ack_wait * 1e9), "max_deliver": DELIVER_FOREVER, "max_ack_pending": spec.max_ack_pending,
        "filter_subjects": spec.partition_filters(k), "priority_groups": [GROUP], "priority_policy": "pinned_client",
        "priority_timeout": int(spec.pinned_ttl * 1e9), "num_replicas": spec.replicas,
    }


async def _api(js: JetStreamContext, subject: str, body: dict | None = None) -> dict | None:
    return await jsapi.call(js._nc, subject, body)  # nats-py keeps the connection there: the one private name here


async def _durables_on_server(js: JetStreamContext, spec: ConsumerSpec) -> set[str]:
    """The server's consumers that belong to `spec`: its own name, or its partitions."""
    pattern = re.compile(rf"{re.escape(spec.name)}(-p\d+)?")
    try:
        return {c.name for c in await js.consumers_info(spec.stream) if pattern.fullmatch(c.name)}
    except NotFoundError:
        return set()


def _batched(js: JetStreamContext, spec: StreamSpec, topology: Topology) -> bool:
    """Event streams allow fast batches where the server has them (DLQ streams take single publishes)."""
    event_streams = {c.stream.name for c in topology.contexts.values()}
    return spec.name in event_streams and server_batches(js._nc)  # js._nc: nats-py keeps the connection there


def cluster_size(js: JetStreamContext) -> int | None:
    """How many servers the connected one is clustered with, itself included, from its INFO
    (None when a clustered server does not advertise its peers, `no_advertise`)."""
    info = js._nc._server_info  # nats-py keeps the connection and its INFO there
    if not info.get("cluster"):
        return 1
    return len(info.get("connect_urls") or []) or None


def _check_replicas(js: JetStreamContext, topology: Topology) -> None:
    """A stream with more replicas than servers can never be placed: said here, naming the fix,
    instead of JetStream's "insufficient resources" from the middle of a provisioning run."""
    size = cluster_size(js)
    too_many = [s for s in topology.streams() if size is not None and s.replicas > size]
    if too_many:
        where = "one server, not a cluster" if size == 1 else f"a cluster of {size} servers reachable now"
        raise SeamqError(ErrorCode.INVALID_TOPOLOGY, (
            f"{', '.join(s.name for s in too_many)}: replicas {max(s.replicas for s in too_many)} needs as many "
            f"JetStream servers, and seamq is connected to {where}; lower `replicas` in the topology (or "
            "SEAMQ_REPLICAS), or start the missing servers"))


async def plan(js: JetStreamContext, topology: Topology) -> list[Change]:
    _check_replicas(js, topology)
    changes = []
    for spec in topology.streams():
        desired = stream_config(spec, batched=_batched(js, spec, topology))
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
        on_server = await _durables_on_server(js, spec)
        if on_server and on_server != set(spec.durables()):
            have = len([d for d in on_server if d != spec.name]) or "no"
            changes.append(Change("consumer", spec.name, "migrate", [("partitions", sorted(on_server), spec.durables())],
                                  [f"it has {have} partitions on the server, the topology says {spec.partitions or 'none'}:"
                                   f" {_MIGRATE}"], stream=spec.stream))
            continue
        if spec.partitions:
            changes += [await _plan_partition(js, spec, k) for k in range(spec.partitions)]
            continue
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


async def _plan_partition(js: JetStreamContext, spec: ConsumerSpec, k: int) -> Change:
    desired = partition_config(spec, k)
    name = desired["durable_name"]
    info = await _api(js, f"CONSUMER.INFO.{spec.stream}.{name}")
    if info is None:
        return Change("consumer", name, "create", stream=spec.stream)
    have = info["config"]
    diffs = []
    for key in _PARTITION_FIELDS:
        mine, theirs = desired.get(key), have.get(key)
        if isinstance(mine, list):
            mine, theirs = sorted(mine), sorted(theirs or [])
        if mine != theirs:
            if key in ("ack_wait", "priority_timeout"):  # nanoseconds in the raw API; seconds in every diff
                mine, theirs = mine / 1e9, (theirs or 0) / 1e9
            diffs.append((key, theirs, mine))
    return Change("consumer", name, "update" if diffs else "unchanged", diffs, stream=spec.stream)


async def migrate_partitions(js: JetStreamContext, spec: ConsumerSpec) -> None:
    """Move `spec` to the partitions the topology declares, where the old consumers left off.

    Only while nobody pulls the old ones and nothing is delivered and unacked: otherwise two
    processes could handle one aggregate at once. The new consumers start after the lowest ack
    floor of the old ones; messages above it that were already acked come again and the inbox
    skips them. Events published without a bucket and not yet handled would go to partition 0
    while later ones of the same aggregate go elsewhere, so they must be handled first."""
    old = sorted(await _durables_on_server(js, spec))
    infos = [await _api(js, f"CONSUMER.INFO.{spec.stream}.{name}") for name in old]
    busy = [name for name, info in zip(old, infos) if info.get("num_waiting") or info.get("num_ack_pending")]
    if busy:
        raise SeamqError(ErrorCode.DESTRUCTIVE_CHANGE, f"cannot migrate {spec.name}: {', '.join(busy)} still "
                         "pulled or with unacked messages; stop every `seamq consume` of it and wait out ack_wait")
    start = min((info["ack_floor"]["stream_seq"] for info in infos), default=0) + 1
    if spec.partitions and spec.name in old:
        try:
            unbucketed = await js.get_msg(spec.stream, seq=start, subject=events_pattern(spec.filter_subject),
                                          next=True)
        except NotFoundError:
            unbucketed = None
        if unbucketed is not None:
            raise SeamqError(ErrorCode.DESTRUCTIVE_CHANGE, f"cannot migrate {spec.name}: stream sequence "
                             f"{unbucketed.seq} and later were published without a partition bucket; run the relay "
                             "with this topology and the consumer without partitions until it has handled them")
    for k, name in enumerate(spec.durables()):
        if name not in old:
            config = partition_config(spec, k) if spec.partitions else consumer_config(spec).as_dict()
            config.update(deliver_policy="by_start_sequence", opt_start_seq=start)
            await _api(js, f"CONSUMER.CREATE.{spec.stream}.{name}", {"stream_name": spec.stream, "config": config})
    for name in old:
        if name not in spec.durables():
            await js.delete_consumer(spec.stream, name)


async def _placed(js: JetStreamContext, config: StreamConfig, timeout: float = 30) -> None:
    """A stream's new replica count is applied after the update returns; its consumers may
    not have more replicas than it has until then (JetStream error 10126)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        info = await js.stream_info(config.name)
        if config.num_replicas == 1 or len((info.cluster and info.cluster.replicas) or []) == config.num_replicas - 1:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise SeamqError(ErrorCode.BROKER_UNAVAILABLE, f"stream {config.name} did not reach "
                             f"{config.num_replicas} replicas within {timeout:g}s; is every server up?")
        await asyncio.sleep(0.1)


async def apply(js: JetStreamContext, topology: Topology, *, force: bool = False,
                migrate: bool = False) -> list[Change]:
    """Plan, refuse destructive changes unless forced (partition migrations unless `migrate`),
    then carry the plan out."""
    changes = await plan(js, topology)
    if migrate:
        for change in [c for c in changes if c.action == "migrate"]:
            await migrate_partitions(js, topology.consumer(change.name))
        changes = await plan(js, topology)
    refused = [c for c in changes if c.destructive and not force or c.action == "migrate"]
    if refused:
        lines = "; ".join(f"{c.kind} {c.name}: {', '.join(c.destructive_reasons)}" for c in refused)
        hint = "" if all(c.action == "migrate" for c in refused) else " (rerun with --force to accept data loss)"
        raise SeamqError(ErrorCode.DESTRUCTIVE_CHANGE, lines + hint)
    try:
        await _carry_out(js, topology, changes)
    except APIError as exc:  # the server refused a change: said, never a traceback
        placing = exc.err_code in PLACEMENT_REFUSED
        raise SeamqError(ErrorCode.BROKER_UNAVAILABLE if placing else ErrorCode.INVALID_TOPOLOGY, (
            f"JetStream refused a change: {exc.description} (err_code {exc.err_code})"
            + ("; is every server of the cluster up and joined (its /healthz answers 200)? Run `seamq "
               "provision` again then: what was done stays done" if placing else ""))) from None
    return changes


async def _carry_out(js: JetStreamContext, topology: Topology, changes: list[Change]) -> None:
    streams = {s.name: s for s in topology.streams()}
    consumers = topology.consumers
    for change in changes:
        if change.kind == "stream":
            config = stream_config(streams[change.name], batched=_batched(js, streams[change.name], topology))
            if change.action == "create":
                await js.add_stream(config)
            elif change.action == "update":
                await js.update_stream(config)
                if any(name == "num_replicas" for name, _, _ in change.diffs):
                    await _placed(js, config)
            elif change.action == "recreate":
                await js.delete_stream(change.name)
                await js.add_stream(config)
    partitions = {name: (spec, k) for spec in consumers.values() if spec.partitions
                  for k, name in enumerate(spec.durables())}
    for change in changes:
        if change.kind == "consumer" and change.name in partitions and change.action != "unchanged":
            spec, k = partitions[change.name]
            await _api(js, f"CONSUMER.CREATE.{spec.stream}.{change.name}",
                       {"stream_name": spec.stream, "config": partition_config(spec, k)})
        elif change.kind == "consumer" and change.action != "unchanged":
            spec = consumers[change.name]
            if change.action == "recreate":
                await js.delete_consumer(spec.stream, spec.name)
            # add_consumer with an existing durable name updates it in place.
            await js.add_consumer(spec.stream, consumer_config(spec))
