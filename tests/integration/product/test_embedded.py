"""Embedded services in a private folder: as root, PostgreSQL runs as an unprivileged user
without seamq changing the mode of any folder it did not create (issue 11)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psycopg
import pytest

from seamq.embedded import postgres as embedded
from seamq.embedded import NatsServer, PostgresServer, running
from seamq.model import SeamqError


def modes(path: Path) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in [path, *path.parents]}


def test_postgres_starts_in_a_private_folder_and_changes_no_mode(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    before = modes(private)
    server = PostgresServer(private / "deeper" / "pg", durable=False)
    try:
        server.start()
        with psycopg.connect(server.dsn()) as conn:
            user = conn.execute("SELECT current_setting('data_directory')").fetchone()[0]
        if os.geteuid() == 0:  # the unprivileged server user could not reach `private`: data kept elsewhere
            assert server.user == embedded.PG_SYSTEM_USER
            assert Path(user).is_relative_to(embedded.RUNTIME_ROOT)
            assert stat.S_IMODE(embedded.RUNTIME_ROOT.stat().st_mode) == 0o755
        else:
            assert Path(user) == (private / "deeper" / "pg").resolve()
        assert (private / "deeper" / "pg.log").exists()  # the server's log stays where it was asked for
    finally:
        server.remove_data()
    assert modes(private) == before
    assert not server.data_dir.exists()


def test_services_started_together_are_all_stopped_when_a_later_one_fails_to_start(tmp_path, monkeypatch):
    """`make bench` and the soak start theirs so (bench.common.services)."""
    nats, pg = NatsServer(tmp_path / "nats"), PostgresServer(tmp_path / "pg")

    def fail():
        raise SeamqError(embedded.ErrorCode.EMBEDDED_SERVICE, "postgres did not start")

    monkeypatch.setattr(pg, "start", fail)
    with pytest.raises(SeamqError):
        with running(nats, pg):
            pass
    assert nats.proc is not None and not nats.running, "nats-server was started, then stopped"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root relocates PostgreSQL's binaries")
def test_private_binaries_are_shared_through_a_root_owned_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "RUNTIME_ROOT", tmp_path / "runtime")
    site = tmp_path / "private" / "site-packages"  # pgserver's layout: RPATH $ORIGIN/../../../pgserver.libs
    install = site / "pgserver" / "pginstall"
    (install / "bin").mkdir(parents=True)
    (install / "share").mkdir()
    (site / "pgserver.libs").mkdir()
    (install / "bin" / "postgres").write_text("#!/bin/sh\n")
    (install / "share" / "postgres.bki").write_text("data")
    (site / "pgserver.libs" / "libpq.so").write_text("lib")
    os.chmod(tmp_path / "private", 0o700)
    shared = embedded._shared_binaries(install)
    assert (shared / "bin" / ".." / ".." / ".." / "pgserver.libs" / "libpq.so").read_text() == "lib"
    binary = shared / "bin" / "postgres"
    below_root = [p for p in binary.parents if p.is_relative_to(embedded.RUNTIME_ROOT)]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o755 for p in below_root)  # others may traverse
    assert (shared / "share" / "postgres.bki").read_text() == "data"
    assert (shared / "bin" / "postgres").stat().st_ino == (install / "bin" / "postgres").stat().st_ino  # linked
    assert embedded._shared_binaries(install) == shared  # built once
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o700
