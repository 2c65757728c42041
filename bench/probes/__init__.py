"""Probes: one question each, asked of a running seamq process (its CPU per unit of work, and with
`--profile F` a py-spy profile of it: F ending .txt gives raw collapsed stacks)."""

import contextlib
import os
import subprocess
import sys

import psycopg

from bench.common import CpuWindow, cpu_per_row

PROFILE = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None


@contextlib.contextmanager
def profiled(pid: int, rate: int = 1000):
    """py-spy records `pid` while the block runs, when the probe was given `--profile F`."""
    if PROFILE is None:
        yield
        return
    spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid", str(pid),
                            "-o", PROFILE, "--rate", str(rate), *(["-f", "raw"] if PROFILE.endswith(".txt") else [])],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(2)
        spy.wait(30)


async def inbox_rate(dsn: str, cpu: CpuWindow, count: int) -> tuple[float, dict]:
    """Messages a second from the first inbox row processed to the last, and CPU per message."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = lambda: conn.execute("SELECT count(*) FROM inbox_messages WHERE status = 'processed'").fetchone()[0]  # noqa: E731
        used = await cpu_per_row(cpu, done, count, timeout=600)
        n, seconds = conn.execute("SELECT count(*), extract(epoch FROM max(processed_at) - min(processed_at)) "
                                  "FROM inbox_messages").fetchone()
    return n / float(seconds), used
