import subprocess

import pytest

from seamq.model import ErrorCode, SeamqError
from seamq.jobs.route import ROUTE
from seamq.topology import load_topology
from seamq.units import parse_duration, parse_size

from helpers import SEAMQ


def test_default_is_sds047_section_10():
    topo = load_topology()
    sea = topo.contexts["sea"].stream
    assert (sea.name, sea.subjects, sea.retention, sea.storage) == ("SEA_EVENTS", ("sea.event.>",), "limits", "file")
    assert sea.max_age == 7 * 86400 and sea.max_bytes == 10**10 and sea.duplicate_window == 120
    assert topo.contexts["vibespro"].stream.name == "VIBESPRO_EVENTS"
    assert topo.contexts["sea"].dlq.subjects == ("sea.dlq.>",)
    consumer = topo.consumers["sea__from_vibespro"]
    assert (consumer.stream, consumer.filter_subject) == ("VIBESPRO_EVENTS", "vibespro.event.>")
    assert (consumer.ack_wait, consumer.max_deliver, consumer.max_ack_pending) == (120, 20, 50)
    assert topo.consumers["vibespro__from_sea"].stream == "SEA_EVENTS"


def test_replicas_override():
    assert {s.replicas for s in load_topology(replicas=3).streams()} == {3}


def test_units():
    assert parse_duration("500ms") == 0.5 and parse_duration("2m") == 120 and parse_duration(5) == 5
    assert parse_size("10GB") == 10**10 and parse_size("1KiB") == 1024
    with pytest.raises(ValueError):
        parse_duration("7 days")


BAD = {
    "contexts:\n  sea:\n    stream:\n      max_age: 7 days\n": "contexts.sea.stream.max_age",
    "contexts:\n  sea:\n    stream:\n      storage: disk\n": "contexts.sea.stream.storage",
    "contexts:\n  sea:\n    stream:\n      colour: red\n": "contexts.sea.stream.colour",
    "contexts:\n  Sea-Ctx: {}\n": "contexts",
    "contexts:\n  sea: {}\nconsumers:\n  sea_reads_vibespro: {}\n": "consumers.sea_reads_vibespro",
    "contexts:\n  sea: {}\nconsumers:\n  sea__from_ghost: {}\n": "consumers.sea__from_ghost",
    "contexts:\n  sea: {}\nconsumers:\n  sea__from_sea:\n    max_deliver: 0\n": "consumers.sea__from_sea.max_deliver",
    "contexts:\n  sea:\n    stream:\n      name: lower\n": "contexts.sea.stream.name",
}


@pytest.mark.parametrize("text,key", BAD.items(), ids=list(BAD.values()))
def test_bad_file_names_file_and_key(tmp_path, text, key):
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    with pytest.raises(SeamqError) as err:
        load_topology(path)
    assert err.value.code == ErrorCode.INVALID_TOPOLOGY
    assert str(path) in err.value.message
    assert f": {key}:" in err.value.message


def test_not_yaml_and_missing_file(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("contexts: [unclosed")
    with pytest.raises(SeamqError, match="not valid YAML"):
        load_topology(path)
    with pytest.raises(SeamqError, match="cannot read"):
        load_topology(tmp_path / "missing.yaml")


def test_cli_rejects_bad_topology_with_exit_2(tmp_path):
    path = tmp_path / "topology.yaml"
    path.write_text("contexts:\n  sea:\n    stream:\n      max_age: forever\n")
    result = subprocess.run([*SEAMQ, "provision", "--dry-run", "--topology", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "INVALID_TOPOLOGY" in result.stderr
    assert "contexts.sea.stream.max_age" in result.stderr and str(path) in result.stderr


def test_every_context_has_one_rule_for_where_its_rows_go(tmp_path):
    """A part's route (the job server's intake) is in the topology, beside the file's contexts: the
    relay asks the topology, never a name of its own (issue 48)."""
    topo = load_topology(routes=[ROUTE])
    assert topo.destination("ojs", "enqueue", 1, 7) == ("ojs.enqueue", "OJS_ENQUEUE")
    assert topo.destination("sea", "order_placed", 2, 7) == ("sea.event.order_placed.v2", "SEA_EVENTS")
    with pytest.raises(SeamqError, match="context 'ghost' has no stream"):
        topo.destination("ghost", "order_placed", 1, 7)
    with pytest.raises(SeamqError, match="context 'ojs' has no stream"):
        load_topology().destination("ojs", "enqueue", 1, 7)  # the route is only there once registered
    taken = tmp_path / "taken.yaml"
    taken.write_text("contexts:\n  ojs: {}\n")
    with pytest.raises(SeamqError, match=r"contexts\.ojs: context name 'ojs' is seamq's own"):
        load_topology(taken, routes=[ROUTE])
    taken.write_text("contexts:\n  sea:\n    stream:\n      name: OJS_ENQUEUE\n")
    with pytest.raises(SeamqError, match="stream names must be unique"):
        load_topology(taken, routes=[ROUTE])
    taken.write_text("contexts:\n  ojs: {}\n")
    result = subprocess.run([*SEAMQ, "provision", "--dry-run", "--topology", str(taken)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "contexts.ojs" in result.stderr  # the CLI registers the jobs route


@pytest.mark.parametrize("seconds,text", [(604800, "7d"), (120, "2m"), (0.5, "500ms"), (90, "90s"), (3600, "1h"),
                                          (1.25, "1250ms")])
def test_durations_are_shown_as_the_topology_writes_them(seconds, text):
    from seamq.units import format_duration, parse_duration

    assert format_duration(seconds) == text and parse_duration(text) == seconds


def test_provision_diffs_show_durations_not_seconds():
    from seamq.cli.provision import _shown

    assert _shown("max_age", 604800.0) == "7d" and _shown("ack_wait", 120.0) == "2m"
    assert _shown("max_deliver", 20) == "20" and _shown("num_replicas", 0) == "0"
