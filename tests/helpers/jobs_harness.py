"""`seamq jobs serve` and `seamq jobs worker` as subprocesses, for the tests that need the real ones;
what the workers' runs wrote (tests/helpers/jobs_handlers.py), read back."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from seamq.embedded import JobServer
from helpers import TESTS


@contextmanager
def served(tmp_path_factory, name: str, *, test_mode: bool = False, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """A nats-server and `seamq jobs serve` of their own, for a module's tests; yields the server's URL."""
    from seamq.embedded import NatsServer

    nats = NatsServer(tmp_path_factory.mktemp(name) / "nats")
    nats.start()
    server = JobServer(nats.url, tmp_path_factory.mktemp(f"{name}-log") / "server.log", test_mode=test_mode,
                       extra=extra)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()
        nats.kill()


def start_worker(how: list[str], *, queue: str, handler: str, effects: Path, log: Path, nats_url: str = "",
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> subprocess.Popen:
    """`seamq jobs worker` (`how`: ["--url", URL] or ["--nats"]) running tests/helpers/jobs_handlers.py's
    `handler`, which writes its runs to `effects`."""
    paths = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]  # a caller's own path kept after
    env = {**os.environ, "JOBS_TEST_EFFECTS": str(effects), "PYTHONPATH": os.pathsep.join(paths),
           **({"SEAMQ_NATS__URL": nats_url} if nats_url else {}), **(env or {})}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "seamq", "jobs", "worker", *how, "--queue", queue,
                                 "--handler", f"helpers.jobs_handlers:{handler}", "--concurrency", "8", "--grace", "20",
                                 *extra], env=env, stdout=out, stderr=subprocess.STDOUT)


async def push_numbered(client: Any, count: int, job_type: str, options: dict) -> list[str]:
    """Jobs 0..count-1 (`args: [n]`), pushed 100 at a time; their ids in order."""
    ids: list[str] = []
    for start in range(0, count, 100):
        batch = [{"type": job_type, "args": [n], "options": options} for n in range(start, min(start + 100, count))]
        ids += [job["id"] for job in await client.push_batch(batch)]
    return ids


RECORD = re.compile(r"(start|end|fail) (\S+) (\d+) (\d+) (\S+)$")  # as jobs_handlers.span writes it


def runs_of(path: Path) -> dict[str, list[dict]]:
    """Each job's runs as tests/helpers/jobs_handlers.py's `span` wrote them: start, how it ended (end, fail,
    or None when cut short), by which process."""
    runs: dict[str, list[dict]] = defaultdict(list)
    lines = path.read_text().splitlines() if path.exists() else []
    # A worker killed in the middle of a write that crosses a page leaves part of its line, which the
    # next line written joins: each line's last whole record is read.
    found = (RECORD.search(line) for line in lines)
    for what, job_id, attempt, pid, at in (record.groups() for record in found if record):
        if what == "start":
            runs[job_id].append({"attempt": int(attempt), "pid": int(pid), "start": float(at), "end": None,
                                 "how": None})
        else:
            run = next(r for r in runs[job_id] if r["attempt"] == int(attempt) and r["pid"] == int(pid))
            run.update(end=float(at), how=what)
    return runs


def start_beside(servers: list[JobServer], nats_url: str, folder: Path, *, queue: str, handler: str,
                 effects: Path) -> list[subprocess.Popen]:
    """A worker over HTTP per server and two `--nats` ones on `queue`, their logs `folder`/worker-N.log."""
    return [start_worker(how, queue=queue, handler=handler, effects=effects, log=folder / f"worker-{n}.log",
                         nats_url=nats_url)
            for n, how in enumerate([["--url", s.url] for s in servers] + [["--nats"], ["--nats"]])]


def running(workers: list[subprocess.Popen], folder: Path) -> None:
    assert all(w.poll() is None for w in workers), [(folder / f"worker-{n}.log").read_text() for n in range(len(workers))]


async def stopped(workers: list[subprocess.Popen], servers: list[JobServer]) -> None:
    """Every worker stopped as an operator stops it (SIGTERM, then waited for), then every server."""
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        await asyncio.to_thread(worker.wait, 30)
    for server in servers:
        server.stop()
