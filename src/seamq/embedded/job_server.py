"""`seamq jobs serve` as a child process on a free port of 127.0.0.1: for tests that need a real job
server beside their own NATS (the suite's, the bench's), started, stopped, or killed -9 to inject
a fault. Its output goes to a log file it is given; a server that does not answer its health
check in time is said with the end of that log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from seamq.embedded.process import free_port


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
