"""docs/jobs.md's quick start, run as written: its two files in a fresh folder, its commands (on a free
port instead of 8080 (in the files too), against the harness's nats-server), and the job it enqueues ends completed."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from seamq.embedded import free_port
from seamq.jobs.model import parse_time

DOC = Path(__file__).resolve().parents[3] / "docs" / "jobs.md"


def quick_start() -> tuple[dict[str, str], list[str]]:
    text = DOC.read_text()
    files = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S)[:2]:
        name = re.match(r"# ([\w/.]+\.py):", block).group(1)
        files[name] = block
    commands = [line.split("  #")[0].strip() for line in re.findall(r"```sh\n(.*?)```", text, re.S)[0].splitlines()]
    return files, commands


def wait_for_health(url: str, server: subprocess.Popen, timeout: float = 180) -> None:
    """Until the server answers (a busy machine can take many seconds to start one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "the job server exited"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the job server did not answer {url} within {timeout:.0f} s")


def test_the_quick_start_runs_as_written(nats_server, tmp_path):
    files, commands = quick_start()
    assert sorted(files) == ["enqueue.py", "myapp/jobs.py"] and len(commands) == 4
    port = str(free_port())
    for name, code in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code.replace("8080", port))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}, "SEAMQ_NATS__URL": nats_server.url,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    words = [command.replace("8080", port).split() for command in commands]
    serve, worker, enqueue, show = words
    assert serve[:3] == ["seamq", "jobs", "serve"] and worker[:3] == ["seamq", "jobs", "worker"]
    started = []
    try:
        for command in (serve, worker):
            with open(tmp_path / f"{command[2]}.log", "wb") as log:  # the child keeps its own copy
                started.append(subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT))
            if command is serve:  # the worker goes second, as the guide says: it refuses a server not up yet
                wait_for_health(f"http://127.0.0.1:{port}/ojs/v1/health", started[0])
        job_id = None
        for _ in range(100):  # until the server answers
            done = subprocess.run(enqueue, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
            if done.returncode == 0:
                job_id = done.stdout.strip()
                break
            time.sleep(0.2)
        assert job_id, done.stderr
        shown = {}
        for _ in range(300):
            shown = json.loads(subprocess.run([*[w.replace("JOB_ID", job_id) for w in show], "--json"], cwd=tmp_path,
                                              env=env, capture_output=True, text=True, timeout=60).stdout)
            if shown["state"] == "completed":
                break
            time.sleep(0.1)
        assert shown["state"] == "completed" and shown["result"] == {"sent": True}, shown
        assert shown["type"] == "email.send" and shown["args"] == ["ada@example.com", "hi"]
    finally:
        for process in started:
            process.terminate()
            process.wait(30)


async def test_the_checkpoint_example_resumes_as_written(nats_server, tmp_path):
    """docs/jobs.md's checkpoint example, its file as written, run by `seamq jobs worker --nats` on a job
    whose last attempt (here: a save through the API before it runs) got to row 2 of 5."""
    from seamq.jobs.client import JobsClient

    from helpers.jobs_harness import JobServer

    [block] = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if b.startswith("# myapp/migrate.py:")]
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "migrate.py").write_text(block)
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    worker = None
    try:
        async with JobsClient(server.url) as client:
            [job] = await client.push_batch([{"type": "rows.copy", "args": [5], "options": {"queue": "rows"}}])
            await client.save_checkpoint(job["id"], 2)
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")},
                   "SEAMQ_NATS__URL": nats_server.url}
            with open(tmp_path / "worker.log", "wb") as log:
                worker = subprocess.Popen([sys.executable, "-m", "seamq", "jobs", "worker", "--nats", "--queue", "rows",
                                           "--handler", "myapp.migrate:jobs"], cwd=tmp_path, env=env, stdout=log,
                                          stderr=subprocess.STDOUT)
            for _ in range(1200):  # a liveness bound only
                shown = await client.job(job["id"])
                if shown["state"] == "completed":
                    break
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                await asyncio.sleep(0.05)
            assert shown["result"] == {"copied": 3, "resumed_from": 2}, shown
            assert shown["checkpoint"] == {"state": 5, "sequence": 4}
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        server.stop()


async def test_the_rate_limit_example_runs_as_written(nats_server, tmp_path):
    """docs/jobs.md's rate limit example, its file as written and its two commands: 30 invoices enqueued
    (the key printed as it stands), run by `seamq jobs worker --nats` 10 a second at most, 3 at once."""
    from helpers.jobs_harness import JobServer, runs_of

    [block] = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if b.startswith("# myapp/invoices.py:")]
    assert "python -m myapp.invoices http://127.0.0.1:8080 30" in DOC.read_text()
    assert "seamq jobs worker --nats --queue invoices\n--handler myapp.invoices:jobs" in DOC.read_text()
    assert "    ...  # call the partner's API\n" in block
    (tmp_path / "myapp").mkdir()
    # The example as written, its function also noting each run (start and end) for the count below.
    (tmp_path / "myapp" / "invoices.py").write_text(block.replace("    ...  # call the partner's API\n",
                                                                  "    await _noted(n)\n") + NOTED)
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}, "SEAMQ_NATS__URL": nats_server.url,
           "RUNS": str(tmp_path / "runs.txt")}
    try:
        done = subprocess.run([sys.executable, "-m", "myapp.invoices", server.url, "30"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "'key': 'partner-api'" in done.stdout, done.stdout + done.stderr
        shown = await worked(tmp_path, env, server.url, "invoices", "myapp.invoices:jobs", 30)
    finally:
        server.stop()
    starts = sorted(parse_time(job["started_at"]) for job in shown)
    assert len(starts) == 30
    assert max(sum(1 for s in starts[i:] if (s - t).total_seconds() < 1) for i, t in enumerate(starts)) <= 10
    runs = [r for rs in runs_of(tmp_path / "runs.txt").values() for r in rs]
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    assert max(sum(step for _, step in edges[:i + 1]) for i in range(len(edges))) <= 3


NOTED = '''

async def _noted(n):  # added by the test
    import os, time
    with open(os.environ["RUNS"], "a") as runs:
        runs.write(f"start {n} 1 {os.getpid()} {time.time()}\\n")
    await asyncio.sleep(0.1)
    with open(os.environ["RUNS"], "a") as runs:
        runs.write(f"end {n} 1 {os.getpid()} {time.time()}\\n")
'''


async def test_the_tenants_example_runs_as_written(nats_server, tmp_path):
    """docs/jobs.md's tenants example, its file and its two commands as written: beta's 10 reports,
    enqueued after acme's 100, start among the worker's first fetches."""
    from helpers.jobs_harness import JobServer

    text = DOC.read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith("# myapp/reports.py:")]
    assert "`python -m myapp.reports http://127.0.0.1:8080`" in text
    assert "`seamq jobs worker --nats --queue\nreports --handler myapp.reports:jobs`" in text
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "reports.py").write_text(block)
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}, "SEAMQ_NATS__URL": nats_server.url}
    try:
        done = subprocess.run([sys.executable, "-m", "myapp.reports", server.url], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "'tenant_id': 'beta'" in done.stdout and "'available': 10" in done.stdout, \
            done.stdout + done.stderr
        shown = await worked(tmp_path, env, server.url, "reports", "myapp.reports:jobs", 110)
    finally:
        server.stop()
    order = sorted((job["started_at"], job["meta"]["tenant_id"]) for job in shown)
    beta = [n for n, (_, customer) in enumerate(order) if customer == "beta"]
    assert len(beta) == 10 and beta[-1] < 2 * 10 + 10, beta  # the worker fetches 10 at most


async def test_the_encrypted_args_example_runs_as_written(nats_server, tmp_path):
    """docs/jobs.md's sealed-args example, its file and commands as written: the server holds one
    ciphertext string; the worker, given the key, calls the function with the args in the clear."""
    import base64

    from helpers.jobs_harness import JobServer

    text = DOC.read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith("# myapp/mail.py:")]
    assert "`python -m myapp.mail http://127.0.0.1:8080`" in text
    assert "`seamq jobs worker --nats --queue mail --handler\nmyapp.mail:jobs`" in text
    assert "    ...  # send it\n" in block
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "mail.py").write_text(block.replace(  # the example, its function also noting its args
        "    ...  # send it\n", "    open(os.environ['NOTED'], 'a').write(f'{address} {card_last4}\\n')\n"))
    key = base64.b64encode(bytes(range(32))).decode()
    server = JobServer(nats_server.url, tmp_path / "server.log").start()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}, "SEAMQ_NATS__URL": nats_server.url,
           "SEAMQ_JOBS__ENCRYPTION_KEYS": f"k1:{key}", "NOTED": str(tmp_path / "noted.txt")}
    try:
        done = subprocess.run([sys.executable, "-m", "myapp.mail", server.url], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "example.com" not in done.stdout and len(ast.literal_eval(done.stdout)) == 1, done.stderr
        [shown] = await worked(tmp_path, env, server.url, "mail", "myapp.mail:jobs", 1)
    finally:
        server.stop()
    assert shown["result"] == "sent"
    assert (tmp_path / "noted.txt").read_text() == "ada@example.com 4242\n"
    assert key not in (tmp_path / "worker.log").read_text()


async def worked(tmp_path, env: dict, server_url: str, queue: str, handler: str, count: int) -> list[dict]:
    """`seamq jobs worker --nats --queue QUEUE --handler HANDLER`, run in the example's folder until `count`
    jobs of the queue completed; those jobs as the server shows them."""
    from seamq.jobs.client import JobsClient

    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "seamq", "jobs", "worker", "--nats", "--queue", queue,
                                   "--handler", handler], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        async with JobsClient(server_url) as client:
            for _ in range(2400):  # a liveness bound only
                found = await client.jobs(queue=queue, state="completed")
                if len(found) >= count:
                    break
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                await asyncio.sleep(0.05)
            return [await client.info(job["id"]) for job in found]
    finally:
        worker.terminate()
        worker.wait(30)
