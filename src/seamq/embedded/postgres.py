"""An embedded PostgreSQL (pgserver's binaries, or Debian's), run as an unprivileged system user
when seamq runs as root (see seamq.embedded)."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from seamq.embedded.process import _Process, _tail, _wait_for_port, free_port
from seamq.model import ErrorCode, SeamqError

PG_SYSTEM_USER = "seamq-pg"
# As root: where PostgreSQL's binaries and data go when their own folders are private.
RUNTIME_ROOT = Path(os.environ.get("SEAMQ_ROOT_RUNTIME_DIR", "/var/lib/seamq"))


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
    # Several processes may start their first PostgreSQL at once (the test workers on a new machine):
    # one adds the user while the others wait, then find it.
    with open(Path(tempfile.gettempdir()) / f".{PG_SYSTEM_USER}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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
            raise SeamqError(ErrorCode.EMBEDDED_SERVICE,
                             f"cannot prepare PostgreSQL binaries in {target}: {exc}") from exc
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

    def __init__(self, data_dir: Path, port: int | None = None, *, durable: bool = True,
                 socket_dir: Path | None = None) -> None:
        """`socket_dir`: also listen on a Unix socket there (made for the server's user), which a
        process in another network namespace can reach (the partition tests' workers)."""
        self.socket_dir = socket_dir
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

    def socket_dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}&port={self.port}"

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
            self._create()

    def _create(self) -> None:
        """The cluster's files, made anew (a standby copies its primary's instead: tests/helpers/failover.py)."""
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
        if self.socket_dir and self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.socket_dir, entry.pw_uid, entry.pw_gid)
        self._stop_leftover()
        # Beside the folder asked for, opened by us: the server writes to the inherited file.
        log = self.requested_dir.parent / f"{self.requested_dir.name}.log"
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir or ""),
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
                    raise SeamqError(ErrorCode.EMBEDDED_SERVICE,
                                     f"postgres not ready; see {log}:\n{_tail(log)}") from None
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
