import subprocess

import pytest
from nats.js.api import StorageType

from seamq.model import ErrorCode, SeamqError
from seamq.nats.provision import apply, plan

from helpers import SEAMQ


async def test_apply_creates_everything_then_nothing(nc, topology):
    js = nc.jetstream()
    first = await apply(js, topology)
    assert {c.action for c in first} == {"create"}
    assert len(first) == 4 + 2  # 2 event streams, 2 DLQ streams, 2 consumers
    second = await apply(js, topology)
    assert {c.action for c in second} == {"unchanged"}
    info = await js.stream_info("SEA_EVENTS")
    assert info.config.subjects == ["sea.event.>"] and info.config.duplicate_window == 120
    consumer = await js.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")
    assert (consumer.config.ack_wait, consumer.config.max_deliver, consumer.config.max_ack_pending) == (120, -1, 50)


async def test_drift_is_detected_and_repaired(nc, provisioned):
    js = nc.jetstream()
    info = await js.stream_info("SEA_EVENTS")
    info.config.max_age = 3600  # edited behind our back
    await js.update_stream(info.config)
    consumer = await js.consumer_info("VIBESPRO_EVENTS", "sea__from_vibespro")
    consumer.config.max_deliver = 3
    await js.add_consumer("VIBESPRO_EVENTS", consumer.config)

    drift = {(c.kind, c.name): c for c in await plan(js, provisioned) if c.action != "unchanged"}
    assert drift[("stream", "SEA_EVENTS")].diffs == [("max_age", 3600.0, 7 * 86400.0)]
    assert drift[("consumer", "sea__from_vibespro")].diffs == [("max_deliver", 3, -1)]
    assert not any(c.destructive for c in drift.values())

    await apply(js, provisioned)
    assert {c.action for c in await plan(js, provisioned)} == {"unchanged"}


async def test_storage_change_needs_force(nc, provisioned):
    js = nc.jetstream()
    await js.delete_stream("SEA_DLQ")
    info_cfg = (await js.stream_info("SEA_EVENTS")).config  # a template for a memory stream
    info_cfg.name, info_cfg.subjects, info_cfg.storage = "SEA_DLQ", ["sea.dlq.>"], StorageType.MEMORY
    await js.add_stream(info_cfg)

    with pytest.raises(SeamqError) as err:
        await apply(js, provisioned)
    assert err.value.code == ErrorCode.DESTRUCTIVE_CHANGE and "SEA_DLQ" in err.value.message
    assert (await js.stream_info("SEA_DLQ")).config.storage == StorageType.MEMORY  # untouched

    changes = await apply(js, provisioned, force=True)
    assert [c.action for c in changes if c.name == "SEA_DLQ"] == ["recreate"]
    assert (await js.stream_info("SEA_DLQ")).config.storage == StorageType.FILE


async def test_removing_subjects_with_data_is_destructive(nc, provisioned):
    js = nc.jetstream()
    info = await js.stream_info("SEA_EVENTS")
    info.config.subjects = ["sea.event.>", "sea.legacy.>"]
    await js.update_stream(info.config)
    await js.publish("sea.legacy.thing", b"{}")
    change = next(c for c in await plan(js, provisioned) if c.name == "SEA_EVENTS")
    assert change.destructive and "sea.legacy.>" in change.destructive_reasons[0]


def test_cli_dry_run_prints_diff_and_changes_nothing(nats_server, provisioned_sync_env):
    env = provisioned_sync_env
    result = subprocess.run([*SEAMQ, "provision", "--dry-run"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "dry run" in result.stdout and "max_age" in result.stdout and "update" in result.stdout
    again = subprocess.run([*SEAMQ, "provision", "--dry-run"], capture_output=True, text=True, env=env)
    assert "max_age" in again.stdout  # still drifted: the dry run changed nothing
    applied = subprocess.run([*SEAMQ, "provision"], capture_output=True, text=True, env=env)
    assert applied.returncode == 0 and "update" in applied.stdout


@pytest.fixture
def provisioned_sync_env(nats_server, service_env):
    """Provision through the CLI, then drift SEA_EVENTS' max_age on the server."""
    subprocess.run([*SEAMQ, "provision"], check=True, capture_output=True, env=service_env)
    import asyncio

    import nats

    async def drift():
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        info = await js.stream_info("SEA_EVENTS")
        info.config.max_age = 600
        await js.update_stream(info.config)
        await nc.close()

    asyncio.run(drift())
    return service_env


async def test_a_change_the_server_refuses_is_a_coded_error_naming_its_reason(nc, topology):
    """A stream of someone else's that already takes the subjects: JetStream refuses to make ours.
    Said as error[INVALID_TOPOLOGY] with the server's reason, not as a traceback (error[INTERNAL])."""
    js = nc.jetstream()
    await js.add_stream(name="SOMEONE_ELSES", subjects=["vibespro.event.>"])
    with pytest.raises(SeamqError) as refused:
        await apply(js, topology)
    assert refused.value.code == ErrorCode.INVALID_TOPOLOGY
    assert "JetStream refused a change" in str(refused.value) and "err_code" in str(refused.value)
