"""Hosts on a network of their own, for partition tests: each host a Linux network namespace with
one address, all joined by a bridge that lives in a namespace of its own, so nothing of the
machine's own network is touched. A host is cut off by taking its link down at the bridge: its
packets are dropped, not refused, as in a real partition (connections go silent).

Everything is made by `Lab.__enter__` and removed by `__exit__`, whatever happened: the processes
started in the hosts are killed first, then the namespaces deleted (their links go with them).
PostgreSQL stays in the machine's namespace and is reached through a Unix socket, which crosses
network namespaces (the tests cut NATS, not the database).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamq.embedded.nats_server import nats_server_binary

SUBNET = "10.77.0"


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


def namespaces_can_be_made() -> str | None:
    """None when they can, else why not (the tests then say so instead of passing)."""
    name = f"sq-probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"network namespaces cannot be made here (root and iproute2 are needed): {exc}"
    _ip("netns", "del", name)
    return None


def need_namespaces() -> None:
    why = namespaces_can_be_made()
    if why:
        pytest.skip(why)


class Lab:
    def __init__(self, hosts: list[str], root: Path) -> None:
        self.token = secrets.token_hex(3)
        self.hosts = {host: i for i, host in enumerate(hosts, 1)}
        self.root = root
        self.procs: list[subprocess.Popen] = []

    def ns(self, host: str) -> str:
        return f"sq-{self.token}-{host}"

    def addr(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts[host]}"

    def __enter__(self) -> "Lab":
        switch = self.ns("switch")
        try:
            _ip("netns", "add", switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for host, i in self.hosts.items():
                ns = self.ns(host)
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", switch, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", switch, "link", "set", f"v{i}", "master", "br0")
                _ip("-n", switch, "link", "set", f"v{i}", "up")
                _ip("-n", ns, "addr", "add", f"{self.addr(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for host in [*self.hosts, "switch"]:
            subprocess.run(["ip", "netns", "del", self.ns(host)], capture_output=True)

    # ---- processes ---------------------------------------------------------------------------------

    def popen(self, host: str, argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        """`argv` in `host` (`ip netns exec` execs it: the process is the command itself)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], env: dict | None = None, timeout: float = 120) -> str:
        result = subprocess.run(["ip", "netns", "exec", self.ns(host), *argv], env=env, capture_output=True,
                                text=True, timeout=timeout)
        if result.returncode:
            raise AssertionError(f"{argv} in {host} exited {result.returncode}: {result.stderr[-2000:]}")
        return result.stdout

    def get_json(self, host: str, url: str) -> dict | None:
        """GET `url` from inside `host`; None when it does not answer (cut off, or not up yet)."""
        code = ("import sys, urllib.request\ntry:\n    print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
                "\nexcept Exception:\n    print('null')")
        return json.loads(self.run(host, [sys.executable, "-c", code, url], timeout=30) or "null")

    # ---- faults --------------------------------------------------------------------------------------

    def isolate(self, host: str) -> None:
        """Cut `host` off from every other: its link at the bridge goes down (packets dropped)."""
        _ip("-n", self.ns("switch"), "link", "set", f"v{self.hosts[host]}", "down")

    def heal(self, host: str) -> None:
        _ip("-n", self.ns("switch"), "link", "set", f"v{self.hosts[host]}", "up")


class LabNats:
    """A JetStream cluster, a node per host of the lab, each listening on its host's address."""

    CLIENT, ROUTE, MONITOR = 4222, 6222, 8222

    def __init__(self, lab: Lab, hosts: list[str]) -> None:
        self.lab, self.hosts = lab, hosts

    @property
    def url(self) -> str:
        return ",".join(f"nats://{self.lab.addr(h)}:{self.CLIENT}" for h in self.hosts)

    def start(self, timeout: float = 60) -> None:
        routes = ", ".join(f'"nats-route://{self.lab.addr(h)}:{self.ROUTE}"' for h in self.hosts)
        for host in self.hosts:
            home = self.lab.root / host
            (home / "jetstream").mkdir(parents=True, exist_ok=True)
            addr = self.lab.addr(host)
            conf = home / "nats-server.conf"
            conf.write_text(
                f'server_name: "{host}"\nlisten: "{addr}:{self.CLIENT}"\nhttp: "{addr}:{self.MONITOR}"\n'
                f'jetstream {{\n  store_dir: "{home / "jetstream"}"\n}}\n'
                f'cluster {{\n  name: "lab"\n  listen: "{addr}:{self.ROUTE}"\n  routes: [{routes}]\n}}\n')
            self.lab.popen(host, [nats_server_binary(), "-c", str(conf)], home / "nats-server.log")
        deadline = time.monotonic() + timeout
        while not all(self.healthy(h) for h in self.hosts):
            assert time.monotonic() < deadline, f"the lab's JetStream had no leader within {timeout} s"
            time.sleep(0.5)

    def healthy(self, host: str) -> bool:
        return (self.lab.get_json(host, f"http://{self.lab.addr(host)}:{self.MONITOR}/healthz") or {}).get(
            "status") == "ok"

    def holding(self, name: str) -> str | None:
        """The node a client of that connection name is connected to now."""
        for host in self.hosts:
            connz = self.lab.get_json(host, f"http://{self.lab.addr(host)}:{self.MONITOR}/connz") or {}
            if any(c.get("name") == name for c in connz.get("connections") or ()):
                return host
        return None
