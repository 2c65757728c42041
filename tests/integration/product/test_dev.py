"""`seamq dev` (what `make run` runs): embedded services, provisioning, workers, demo, dashboard."""

import json
import os
import queue
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from seamq.embedded import PostgresServer, free_port, port_is_free

from helpers import SEAMQ


def dev_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    nats_port, pg_port = free_port(), free_port()
    env.update(SEAMQ_EMBEDDED__NATS_PORT=str(nats_port), SEAMQ_EMBEDDED__PG_PORT=str(pg_port))
    return env, nats_port, pg_port


def modes(path: Path) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in [path, *path.parents]}


@pytest.fixture
def pg_data(tmp_path):
    """Where `seamq dev --data-dir tmp_path/data` keeps PostgreSQL's files (elsewhere as root: the
    folder is private); removed afterwards."""
    yield
    shutil.rmtree(PostgresServer(tmp_path / "data" / "pg").data_dir, ignore_errors=True)


def test_dev_reaches_ready_with_topology_listed(tmp_path, pg_data):
    env, nats_port, pg_port = dev_env(tmp_path)
    before = modes(tmp_path)  # a private folder (0700), like a clone in /root
    result = subprocess.run([*SEAMQ, "dev", "--data-dir", str(tmp_path / "data"), "--exit-when-ready"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert modes(tmp_path) == before  # no folder seamq did not create has changed its mode
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ready" in out and f"127.0.0.1:{nats_port}" in out and f"127.0.0.1:{pg_port}" in out
    for name in ["SEA_EVENTS", "VIBESPRO_EVENTS", "SEA_DLQ", "VIBESPRO_DLQ", "sea__from_vibespro",
                 "vibespro__from_sea"]:
        assert name in out
    assert out.count("fast batch") == 2  # the relay's way to each event stream (nats-server >= 2.14)
    assert port_is_free(nats_port) and port_is_free(pg_port)  # services stopped on exit
    again = subprocess.run([*SEAMQ, "dev", "--data-dir", str(tmp_path / "data"), "--exit-when-ready"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "unchanged" in again.stdout and "create" not in again.stdout


def test_dev_runs_events_end_to_end(tmp_path, pg_data):
    env, nats_port, pg_port = dev_env(tmp_path)
    result = subprocess.run([*SEAMQ, "dev", "--data-dir", str(tmp_path / "data"), "--run-for", "8"],
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    final = result.stdout.split("final counts", 1)[1]
    for consumer in ("sea__from_vibespro", "vibespro__from_sea"):
        row = next(line for line in final.splitlines() if consumer in line)
        assert handled(row, consumer) > 50, row
    assert port_is_free(nats_port) and port_is_free(pg_port)


def test_dev_on_a_three_node_cluster_runs_r3_streams_three_job_servers_and_stops_every_node(tmp_path, pg_data):
    """`seamq dev --cluster 3`: R3 streams, events end to end, and a job server per node, any of which
    answers for a job pushed through another."""
    env, _, pg_port = dev_env(tmp_path)
    # Stopped by SIGTERM once the checks are done and its dashboard shows events handled, not by --run-for:
    # on a busy machine the checks alone may take longer than any fixed run.
    dev = subprocess.Popen([*SEAMQ, "dev", "--cluster", "3", "--data-dir", str(tmp_path / "data"), "--run-for", "600"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []  # read as written: a full pipe would stop the process that writes to it
    reader = threading.Thread(target=lambda: errors.extend(dev.stderr), daemon=True)
    reader.start()

    def said() -> str:
        """What the run wrote besides its dashboard, for a failure to show."""
        log = tmp_path / "data" / "seamq.log"
        return "stderr:\n" + "".join(errors)[-2000:] + "\nseamq.log:\n" + (log.read_text()[-4000:] if log.exists() else "")

    # Its stdout read as written too: the job servers run in its event loop, which a full pipe would stop
    # while the checks below talk to them (an ack timed out so, once).
    said_out: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in dev.stdout:
            said_out.put(line)
        said_out.put(None)  # its end
    threading.Thread(target=pump, daemon=True).start()
    lines: list[str] = []

    def read_until(seen, limit: float = 600) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                line = said_out.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                return
            lines.append(line)
            if seen(line):
                return

    try:
        read_until(lambda line: "ready" in line and "job servers" in line)
        urls = re.findall(r"job server \(OJS\)\s*│\s*(http://127\.0\.0\.1:\d+)/ojs/v1", "".join(lines))
        assert len(set(urls)) == 3, "".join(lines)[-3000:]
        job = jobs_call(urls[0], "/ojs/v1/jobs", {"type": "dev.check", "args": [1], "options": {"queue": "dev"}})["job"]
        try:
            fetched = fetch_until(urls[2], "dev")
        except OSError as exc:
            raise AssertionError(f"no answer from {urls[2]}: {exc}\n{said()}") from None
        assert [j["id"] for j in fetched] == [job["id"]], said()
        try:
            jobs_call(urls[1], "/ojs/v1/workers/ack", {"job_id": job["id"]})
        except OSError as exc:  # it timed out once in a full run (session 52), with nothing to read
            raise AssertionError(f"no answer from {urls[1]} to the ack: {exc}\n{said()}") from None
        # its dashboard, every 5 s: stopped once events have flowed end to end
        read_until(lambda line: handled(line, "sea__from_vibespro") > 50)
        dev.send_signal(signal.SIGTERM)
        dev.wait(180)
        read_until(lambda line: False, limit=30)  # the rest, to its end
        reader.join(30)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait(60)
    assert dev.returncode == 0, said()
    stdout = "".join(lines)
    assert "NATS cluster (3 servers)" in stdout
    ports = {int(p) for p in re.findall(r"nats://127\.0\.0\.1:(\d+)", stdout)}
    assert len(ports) == 3
    streams = [line for line in stdout.splitlines() if re.match(r"│ \w+_(EVENTS|DLQ) ", line)]
    assert len(streams) == 4 and all(re.search(r"│\s*3\s*│", line) for line in streams)  # replicas 3
    final = stdout.split("final counts", 1)[1]
    row = next(line for line in final.splitlines() if "sea__from_vibespro" in line)
    assert handled(row, "sea__from_vibespro") > 50, row
    # Free once it exited; an ephemeral port can be another test's outgoing connection for a moment, so
    # wait for that, bounded, rather than read one instant.
    every = [*ports, pg_port, *(int(url.rsplit(":", 1)[1]) for url in urls)]
    deadline = time.monotonic() + 30
    while not all(port_is_free(p) for p in every) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in every if not port_is_free(p)] == []


def handled(row: str, consumer: str) -> int:
    """Messages handled, from a row of `seamq dev`'s dashboard or final counts (0 for another row)."""
    numbers = re.findall(r"\d+", row.split(consumer, 1)[1]) if consumer in row else []
    return int(numbers[0]) if numbers else 0


def jobs_call(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def fetch_until(url: str, queue: str) -> list[dict]:
    deadline = time.monotonic() + 30
    fetched = []
    while not fetched and time.monotonic() < deadline:
        fetched = jobs_call(url, "/ojs/v1/workers/fetch", {"queues": [queue], "worker_id": "t"})["jobs"]
    return fetched


def test_dev_runs_the_job_server_too(tmp_path, pg_data):
    """`seamq dev` serves OJS beside the workers: a job pushed to the URL it prints is fetched back."""
    env, nats_port, pg_port = dev_env(tmp_path)
    dev = subprocess.Popen([*SEAMQ, "dev", "--data-dir", str(tmp_path / "data"), "--no-demo", "--run-for", "60"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in dev.stdout:
            found = re.search(r"job server \(OJS\)\s*│\s*(http://127\.0\.0\.1:\d+)/ojs/v1", line)
            url = url or (found and found.group(1))
            if "ready" in line and "job server" in line:
                break
        assert url, "no job server in seamq dev's output"
        job = jobs_call(url, "/ojs/v1/jobs", {"type": "dev.check", "args": [1], "options": {"queue": "dev"}})["job"]
        assert [j["id"] for j in fetch_until(url, "dev")] == [job["id"]]
    finally:
        dev.terminate()
        _, errors = dev.communicate(timeout=60)  # reads what is left, and closes both pipes
    assert dev.returncode == 0, errors[-3000:]
    assert port_is_free(nats_port) and port_is_free(pg_port) and port_is_free(int(url.rsplit(":", 1)[1]))


def test_a_port_asked_for_and_taken_is_refused_with_a_coded_error(tmp_path):
    import socket

    env, _, _ = dev_env(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*SEAMQ, "dev", "--services-only", "--nats-port", str(port), "--data-dir",
                                 str(tmp_path / "data"), "--exit-when-ready"], env=env, capture_output=True, text=True,
                                timeout=120)
    assert result.returncode == 1 and f"error[PORT_IN_USE]: 127.0.0.1:{port} (--nats-port" in result.stderr, \
        result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_services_only_ends_with_a_coded_error_when_its_nats_server_dies(tmp_path, pg_data):
    env, nats_port, pg_port = dev_env(tmp_path)
    dev = subprocess.Popen([*SEAMQ, "dev", "--services-only", "--data-dir", str(tmp_path / "data")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in dev.stdout:
            if "ready" in line:
                break
        found = subprocess.run(["pgrep", "-f", f"nats-server -c {tmp_path / 'data'}"], capture_output=True, text=True)
        [pid] = found.stdout.split()
        os.kill(int(pid), signal.SIGKILL)
        _, stderr = dev.communicate(timeout=60)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait(60)
    assert dev.returncode == 1, stderr[-2000:]
    assert f"error[EMBEDDED_SERVICE]: nats-server (pid {pid}) exited with code -9" in stderr, stderr[-2000:]
    assert "Traceback" not in stderr
    assert port_is_free(pg_port)  # PostgreSQL stopped on the way out
