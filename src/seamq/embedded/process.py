"""A child service seamq starts and owns: spawned in a session of its own, stopped, killed -9,
restarted on the same port; and free ports on 127.0.0.1."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator
from pathlib import Path

from seamq.model import ErrorCode, SeamqError


def free_port() -> int:
    """A port free now on 127.0.0.1, below the kernel's ephemeral range where one is known. A service
    restarted on its port (kill -9, then start) must find it free again, and a port of that range
    may meanwhile be the local end of any process's outgoing connection on the machine (a restarted
    job server once found its port taken so, under a busy test run)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(FIXED_PORTS, low) if low > FIXED_PORTS + 1000 else 0
        if port in _HANDED:  # handed out here before, maybe not yet bound by the service it was for
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED.add(s.getsockname()[1])
            return s.getsockname()[1]
    raise SeamqError(ErrorCode.EMBEDDED_SERVICE, "no free port on 127.0.0.1")


_HANDED: set[int] = set()  # by this process: never handed out twice
FIXED_PORTS = 10_000  # below: ports people give services by hand (5432, 4222, 8080, ...)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # unknown: the kernel's choice


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SeamqError(ErrorCode.EMBEDDED_SERVICE, f"{what} exited at start; see {log}:\n{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise SeamqError(ErrorCode.EMBEDDED_SERVICE, f"{what} did not listen on port {port} within {timeout}s; see {log}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class _Process:
    """A child service: start, stop gracefully, kill -9, restart on the same port."""

    name = "service"
    proc: subprocess.Popen | None = None

    def _spawn(self, argv: list[str], log: Path, **kwargs) -> None:
        self.log = log
        with open(log, "ab") as out:
            # A session of its own: Ctrl-C in the terminal reaches `seamq dev`,
            # which then stops services in order, instead of killing them first.
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None  # poll() also reaps one that ended

    def ended(self) -> str:
        """What became of a service that stopped by itself, for the person who started it."""
        code = self.proc.returncode if self.proc is not None else None
        return f"{self.name} (pid {self.proc.pid if self.proc else '?'}) exited with code {code}; its log, " \
               f"{self.log}:\n{_tail(self.log)}"

    def stop(self, timeout: float = 15) -> None:
        if not self.running:
            return
        self.proc.send_signal(self._stop_signal)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: the fault tests use this to lose unsynced state."""
        if self.running:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def start(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    _stop_signal = signal.SIGTERM


@contextmanager
def running(*services: _Process) -> Iterator[None]:
    """The services started in turn and stopped, last first, when the block ends: also when a later
    one failed to start, so that a PostgreSQL that cannot start leaves no nats-server behind."""
    tried: list[_Process] = []
    try:
        for service in services:
            tried.append(service)
            service.start()
        yield
    finally:
        for service in reversed(tried):
            service.stop()
