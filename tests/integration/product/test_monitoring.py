"""The shipped dashboard and alerting rules refer only to metrics, and labels, that seamq exports."""

from __future__ import annotations

import asyncio
import json
import re

import yaml
from prometheus_client import REGISTRY

from seamq import observability
from seamq.cli.monitoring import shipped
from seamq.consumer import InboxConsumer
from seamq.settings import ConsumerSettings

from seamq.memory import MemoryDeliveries, MemoryInbox, MemoryPublisher
from helpers.lane import SPEC, event, publish

_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def exported() -> dict[str, set[str]]:
    """Every sample name seamq's metrics produce -> its labels."""
    names: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("seamq_"):
            continue
        labels = set(getattr(REGISTRY._names_to_collectors.get(family.name + "_total")
                             or REGISTRY._names_to_collectors.get(family.name), "_labelnames", ()))
        for suffix in ("",) + _SUFFIXES:
            names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def expressions() -> list[str]:
    rules = yaml.safe_load(shipped("prometheus-rules.yaml"))
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads(shipped("grafana-dashboard.json"))
    exprs += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    return exprs


def test_every_metric_and_label_they_use_is_exported():
    metrics = exported()  # every metric of seamq.observability, registered on import
    assert observability.CONSUMER_PENDING._name in metrics
    assert "seamq_consumer_pending" in metrics and "seamq_outbox_oldest_seconds" in metrics
    used = 0
    for expr in expressions():
        names = set(re.findall(r"\bseamq_[a-z_]+", expr))
        assert names, expr
        for name in names:
            assert name in metrics, f"{name} (in {expr!r}) is not a metric seamq exports"
            used += 1
        for group in re.findall(r"by \(([^)]*)\)", expr):
            labels = {label.strip() for label in group.split(",")}
            assert any(labels <= metrics[n] for n in names), f"labels {labels} not on {names}"
    assert used >= 20


def test_the_rules_cover_the_prds_targets_and_say_what_to_do():
    rules = {r["alert"]: r for g in yaml.safe_load(shipped("prometheus-rules.yaml"))["groups"] for r in g["rules"]}
    assert {"SeamqOutboxBacklogOld", "SeamqDeadLetterRateHigh", "SeamqEndToEndLatencyHigh", "SeamqConsumerStalled",
            "SeamqRelayPublishErrors"} <= set(rules)
    assert "> 0.001" in rules["SeamqDeadLetterRateHigh"]["expr"]  # PRD-022: DLQ rate < 0.1%
    assert "histogram_quantile(0.99" in rules["SeamqEndToEndLatencyHigh"]["expr"] and "> 0.5" in \
        rules["SeamqEndToEndLatencyHigh"]["expr"]
    for rule in rules.values():
        assert rule["for"] and rule["labels"]["severity"] and rule["annotations"]["summary"] \
            and rule["annotations"]["description"]


async def test_a_stalled_consumer_keeps_showing_what_waits():
    """With its lanes blocked and max_ack_pending out, fetches return nothing; the gauge must not fall to 0."""
    source = MemoryDeliveries()
    source.max_ack_pending = 2
    for n in range(10):
        publish(source, event(f"v-{n}", n))
    release = asyncio.Event()

    class Blocked:
        transactional = False

        async def __call__(self, envelope, conn, traceparent=None):
            from seamq.envelope import HandlerResult, Outcome

            await release.wait()
            return HandlerResult(Outcome.OK)

    consumer = InboxConsumer(SPEC, source, MemoryInbox(), MemoryPublisher(), lambda t, v: Blocked(),
                             ConsumerSettings(concurrency=2, batch_size=2))
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    gauge = lambda: REGISTRY.get_sample_value("seamq_consumer_pending", {"consumer": SPEC.name})  # noqa: E731
    await asyncio.sleep(0.2)
    assert gauge() == 8
    release.set()
    for _ in range(200):
        if len(source.acked) == 10:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert len(source.acked) == 10 and gauge() == 0
