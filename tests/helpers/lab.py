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
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seamq.embedded.nats_server import nats_server_binary

SUBNET, CLUSTER = "10.77.0", "10.78.0"  # clients and servers; servers' routes


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
    """Skipped, saying why, where namespaces cannot be made (no root); in the soak
    (SEAMQ_LAB_ROUNDS set: `make soak`) that is a failure: a soak that cannot run must not pass."""
    why = namespaces_can_be_made()
    if why and os.environ.get("SEAMQ_LAB_ROUNDS"):
        pytest.fail(f"the partitions soak cannot run here: {why}")
    if why:
        pytest.skip(why)


class Lab:
    """`hosts` on one bridge (addresses SUBNET.n); `servers`, among them, also on a second bridge of
    their own (CLUSTER.n), which their cluster routes use: a server can then be split from its
    peers while clients still reach it (`split`), or cut off from everyone (`isolate`)."""

    def __init__(self, hosts: list[str], root: Path, servers: list[str] = ()) -> None:
        self.token = secrets.token_hex(3)
        self.hosts = {host: i for i, host in enumerate(hosts, 1)}
        self.servers = list(servers)
        self.root = root
        self.procs: list[subprocess.Popen] = []

    def ns(self, host: str) -> str:
        return f"sq-{self.token}-{host}"

    def addr(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts[host]}"

    def cluster_addr(self, host: str) -> str:
        return f"{CLUSTER}.{self.hosts[host]}"

    def __enter__(self) -> "Lab":
        switch = self.ns("switch")
        try:
            _ip("netns", "add", switch)
            for bridge in ("br0", "br1"):
                _ip("-n", switch, "link", "add", bridge, "type", "bridge")
                _ip("-n", switch, "link", "set", bridge, "up")
            for host, i in self.hosts.items():
                _ip("netns", "add", self.ns(host))
                _ip("-n", self.ns(host), "link", "set", "lo", "up")
                self._link(host, f"v{i}", "eth0", "br0", self.addr(host))
                if host in self.servers:
                    self._link(host, f"c{i}", "eth1", "br1", self.cluster_addr(host))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _link(self, host: str, port: str, nic: str, bridge: str, addr: str) -> None:
        switch, ns = self.ns("switch"), self.ns(host)
        _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", nic, "netns", ns)
        _ip("-n", switch, "link", "set", port, "master", bridge)
        _ip("-n", switch, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", nic)
        _ip("-n", ns, "link", "set", nic, "up")

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
            raise AssertionError(f"{argv} in {host} exited {result.returncode}: {result.stdout[-2000:]}"
                                 f"{result.stderr[-2000:]}")
        return result.stdout

    def get_json(self, host: str, url: str) -> dict | None:
        """GET `url` from inside `host`; None when it does not answer (cut off, or not up yet)."""
        code = ("import sys, urllib.request\ntry:\n    print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
                "\nexcept Exception:\n    print('null')")
        return json.loads(self.run(host, [sys.executable, "-c", code, url], timeout=30) or "null")

    # ---- faults --------------------------------------------------------------------------------------

    def isolate(self, host: str) -> None:
        """Cut `host` off from every other: its links at the bridges go down (packets dropped)."""
        self._ports(host, "down", cluster_only=False)

    def split(self, server: str) -> None:
        """Cut `server` off from its peers only: its clients still reach it (a minority of one)."""
        self._ports(server, "down", cluster_only=True)

    def heal(self, host: str) -> None:
        self._ports(host, "up", cluster_only=False)

    def _ports(self, host: str, state: str, cluster_only: bool) -> None:
        i = self.hosts[host]
        ports = ([] if cluster_only else [f"v{i}"]) + ([f"c{i}"] if host in self.servers else [])
        for port in ports:
            _ip("-n", self.ns("switch"), "link", "set", port, state)


class LabNats:
    """A JetStream cluster, a node per host of the lab, each listening on its host's address."""

    CLIENT, ROUTE, MONITOR = 4222, 6222, 8222

    def __init__(self, lab: Lab, hosts: list[str]) -> None:
        self.lab, self.hosts = lab, hosts

    @property
    def url(self) -> str:
        return ",".join(self.url_of(h) for h in self.hosts)

    def url_of(self, host: str) -> str:
        """One node's: a client given it learns the others from the cluster."""
        return f"nats://{self.lab.addr(host)}:{self.CLIENT}"

    def start(self, timeout: float = 60) -> None:
        routes = ", ".join(f'"nats-route://{self.lab.cluster_addr(h)}:{self.ROUTE}"' for h in self.hosts)
        for host in self.hosts:
            home = self.lab.root / host
            (home / "jetstream").mkdir(parents=True, exist_ok=True)
            addr = self.lab.addr(host)
            conf = home / "nats-server.conf"
            conf.write_text(
                f'server_name: "{host}"\nlisten: "{addr}:{self.CLIENT}"\nhttp: "{addr}:{self.MONITOR}"\n'
                f'jetstream {{\n  store_dir: "{home / "jetstream"}"\n}}\n'
                f'cluster {{\n  name: "lab"\n  listen: "{self.lab.cluster_addr(host)}:{self.ROUTE}"\n'
                f'  routes: [{routes}]\n}}\n')
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

    def leaders(self, stream: str, consumer: str, via: str, env: dict) -> tuple[str | None, str | None]:
        """The nodes leading `stream` and its `consumer` now, asked from host `via`; None for one that
        JetStream cannot name now (an election, no meta leader: 503)."""
        code = ("import asyncio, json, os, nats, nats.js.errors\n"
                "async def main():\n"
                "    nc = await nats.connect(os.environ['SEAMQ_NATS__URL'].split(','))\n"
                "    js = nc.jetstream()\n"
                "    try:\n"
                "        s = (await js.stream_info(%r)).cluster.leader\n"
                "    except nats.js.errors.APIError:\n"
                "        s = None\n"
                "    try:\n"
                "        c = (await js.consumer_info(%r, %r)).cluster.leader\n"
                "    except nats.js.errors.APIError:\n"
                "        c = None\n"
                "    print(json.dumps([s, c]))\n"
                "    await nc.close()\n"
                "asyncio.run(main())\n") % (stream, stream, consumer)
        return tuple(json.loads(self.lab.run(via, [sys.executable, "-c", code], env, timeout=60)))
