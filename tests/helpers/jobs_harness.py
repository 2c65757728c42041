"""`seamq jobs serve` and `seamq jobs worker` as subprocesses, for the tests that need the real ones;
what the workers' runs wrote (tests/helpers/jobs_handlers.py), read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from seamq.embedded import free_port
from helpers import TESTS


class JobServer:
    def __init__(self, nats_url: str, log_path: Path, *, test_mode: bool = False, port: int | None = None,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.nats_url, self.log_path, self.test_mode, self.extra = nats_url, Path(log_path), test_mode, extra
        self.env = env or {}
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> "JobServer":
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
        env.update({"SEAMQ_NATS__URL": self.nats_url, "SEAMQ_LOG_LEVEL": "warning", **self.env})
        args = [sys.executable, "-m", "seamq", "jobs", "serve", "--port", str(self.port), *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args + (["--test-mode"] if self.test_mode else []), env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/ojs/v1/health", timeout=1).read()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.kill()
                    raise RuntimeError(f"seamq jobs serve did not start:\n{self.log()[-3000:]}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """kill -9: no chance to tidy up."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


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
    env = {**os.environ, "JOBS_TEST_EFFECTS": str(effects), "PYTHONPATH": str(TESTS),
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


def runs_of(path: Path) -> dict[str, list[dict]]:
    """Each job's runs as tests/helpers/jobs_handlers.py's `span` wrote them: start, how it ended (end, fail,
    or None when cut short), by which process."""
    runs: dict[str, list[dict]] = defaultdict(list)
    lines = path.read_text().splitlines() if path.exists() else []
    for what, job_id, attempt, pid, at in (line.split() for line in lines if len(line.split()) == 5):
        if what == "start":
            runs[job_id].append({"attempt": int(attempt), "pid": int(pid), "start": float(at), "end": None,
                                 "how": None})
        else:
            run = next(r for r in runs[job_id] if r["attempt"] == int(attempt) and r["pid"] == int(pid))
            run.update(end=float(at), how=what)
    return runs
