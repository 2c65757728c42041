"""/healthz and /readyz: what seamq.health decides (pure), and what a running worker answers
while its dependencies come and go."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import urllib.error
import urllib.request

import psycopg

from seamq.embedded import free_port
from seamq.health import Health

from helpers import SEAMQ
from helpers import wait_for


def test_a_busy_loop_past_its_time_is_not_alive_a_resting_one_is():
    health = Health(stale_after=5)
    claim, lane = health.beat("claim"), health.beat("lane_0")
    assert health.live().ok  # nothing started: resting
    claim.turn()
    now = claim.deadline - 5
    assert health.live(now + 4.9).ok
    late = health.live(now + 5.1)
    assert not late.ok and late.checks == {"claim": "busy for more than 5s"}
    claim.rest()
    with lane:
        assert lane.deadline is not None
    assert lane.deadline is None and health.live(now + 1000).ok  # waiting on a timer or a queue is not hanging


async def test_ready_is_every_check_now_and_says_which_failed():
    health = Health(check_timeout=0.2)
    stop = asyncio.Event()
    health.stop = stop

    async def ok():
        pass

    async def down():
        raise ConnectionError("PostgreSQL does not answer")

    async def hangs():
        await asyncio.sleep(10)

    health.check("nats", ok)
    assert (await health.ready()).checks["worker"] == "starting" and not (await health.ready()).ok
    health.started = True
    assert (await health.ready()).ok
    health.check("postgres", down)
    health.check("provisioned", hangs)
    answer = await health.ready()
    assert not answer.ok and answer.checks == {"worker": "ok", "nats": "ok", "provisioned": "no answer within 0.2s",
                                               "postgres": "ConnectionError: PostgreSQL does not answer"}
    health.check("postgres", ok)
    health.check("provisioned", ok)
    assert (await health.ready()).ok
    stop.set()
    assert (await health.ready()).checks["worker"] == "stopping"  # out of rotation while it finishes
    health.beat("claim").turn()
    health.beat("claim").deadline -= 120
    assert not (await health.ready()).ok  # not alive is not ready


def probe(port: int, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            status, body = answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    except OSError:
        return 0, "not listening"
    return status, json.loads(body) if body.startswith("{") else body


async def test_relay_probes_follow_postgres_nats_and_a_hung_claim(dsn, pg_server, nats_server, nc, provisioned,
                                                                  service_env):
    port = free_port()
    env = dict(service_env, SEAMQ_METRICS_PORT=str(port), SEAMQ_HEALTH_STALE_AFTER="3",
               SEAMQ_CONSUMER__HANDLER_TIMEOUT="1")
    relay = subprocess.Popen([*SEAMQ, "relay"], env=env, stderr=subprocess.DEVNULL)
    ready = lambda: probe(port, "/readyz")[0] == 200  # noqa: E731
    try:
        await wait_for(ready, timeout=30, what="ready")
        status, body = probe(port, "/readyz")
        assert body == {"status": "ok", "checks": {"worker": "ok", "nats": "ok", "provisioned": "ok", "postgres": "ok"}}
        metrics = probe(port, "/metrics")
        assert metrics[0] == 200 and "seamq_relay_published_total" in metrics[1]

        pg_server.stop()
        await wait_for(lambda: probe(port, "/readyz")[0] == 503, what="not ready without PostgreSQL")
        assert probe(port, "/readyz")[1]["checks"]["postgres"].startswith("ConnectionError: PostgreSQL does not answer")
        assert probe(port, "/healthz")[0] == 200  # backing off is alive: a restart would not bring PostgreSQL back
        pg_server.start()
        await wait_for(ready, timeout=30, what="ready again with PostgreSQL back")

        await nc.jetstream().delete_stream("SEA_EVENTS")
        status, body = probe(port, "/readyz")
        assert status == 503 and body["checks"]["provisioned"] == "LookupError: stream SEA_EVENTS missing: run " \
                                                                    "`seamq provision`"

        nats_server.stop()
        await wait_for(lambda: probe(port, "/readyz")[1]["checks"]["nats"] != "ok", what="not ready without NATS")
        nats_server.start()

        with psycopg.connect(dsn) as locker:  # the claim waits on this lock: a loop that hangs
            locker.execute("LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE")
            await wait_for(lambda: probe(port, "/healthz")[0] == 503, timeout=20, what="not alive while a claim hangs")
            assert "busy for more than 3s" in json.dumps(probe(port, "/healthz")[1])
        await wait_for(lambda: probe(port, "/healthz")[0] == 200, timeout=20, what="alive once the claim went on")
    finally:
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(30) == 0
    assert probe(port, "/healthz") == (0, "not listening")


async def test_consumer_ready_names_its_consumer_and_dlq(dsn, nats_server, nc, topo, service_env, tmp_path):
    port = free_port()
    env = dict(service_env, SEAMQ_METRICS_PORT=str(port), SEAMQ_CONSUMER__HANDLER_URL="http://127.0.0.1:9/handle")
    topology_file = tmp_path / "topology.yaml"  # the `topo` fixture's, provisioned
    consumer = subprocess.Popen([*SEAMQ, "consume", "--consumer", "sea__from_vibespro"],
                                env=dict(env, SEAMQ_TOPOLOGY_FILE=str(topology_file)), stderr=subprocess.DEVNULL)
    try:
        await wait_for(lambda: probe(port, "/readyz")[0] == 200, timeout=30, what="consumer ready")
        assert probe(port, "/healthz")[0] == 200
        js = nc.jetstream()  # provisioned before 0.3: JetStream's own delivery limit, which holds could use up
        info = await js.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")
        info.config.max_deliver = 20
        await js.add_consumer("VIBESPRO_EVENTS", info.config)
        status, body = probe(port, "/readyz")
        assert status == 503 and "stops delivering after 20 deliveries: run `seamq provision`" in \
            body["checks"]["provisioned"]
        await js.delete_consumer("VIBESPRO_EVENTS", "sea__from_vibespro")
        status, body = probe(port, "/readyz")
        assert status == 503 and "consumer sea__from_vibespro missing" in body["checks"]["provisioned"]
    finally:
        consumer.send_signal(signal.SIGTERM)
        consumer.wait(30)
