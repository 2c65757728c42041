"""docs/first-app.md, run as written: its files saved, its commands run in order in an empty folder.

The walkthrough's own words drive the run: a block whose first line is `# name` is saved as that
file; a command ending in `&` runs in the background, and `# wait for "X"` after it waits until
its output (or any background process's) says X; `# prints "X"` checks a command's output. Only
the install lines are not run: this test uses the checkout's own install, and checks that the
extra they name exists (tests/integration/product/test_install.py installs into a fresh venv). The ports the walkthrough
names (NATS 4222, PostgreSQL 5432, the handler service 8001) are swapped for free ones everywhere
they appear, so it runs as written on other ports than the defaults.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from seamq.embedded import PostgresServer, free_port

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "first-app.md").read_text()
TIMEOUT = 90.0


class Walkthrough:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        bin_dir = str(Path(sys.executable).parent)
        self.env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8"}
        self.background: list[tuple[subprocess.Popen, Path]] = []
        self.ports = {port: str(free_port()) for port in ("4222", "5432", "8001")}

    def output(self) -> str:
        return "".join(log.read_text(errors="replace") for _, log in self.background)

    def wait_for(self, text: str, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while text not in self.output():
            dead = [p.args for p, _ in self.background if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, \
                f"{what}: no {text!r} (ended: {dead})\n{self.output()[-3000:]}"
            time.sleep(0.2)

    def run(self, line: str) -> None:
        command, _, comment = line.partition("   #")
        command = re.sub(r"\b(4222|5432|8001)\b", lambda m: self.ports[m[1]], command.strip())
        waits = re.findall(r'wait for "([^"]+)"', comment)
        prints = re.findall(r'prints "([^"]+)"', comment)
        if re.match(r"(python -m venv|\. \.venv/bin/activate|pip install)", command):
            for extra in re.findall(r"seamq\[(\w+)\]", command):
                assert extra in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
                    "optional-dependencies"], f"the install line names an extra seamq has not: {extra}"
            return
        if command.startswith("export "):
            name, _, value = command.removeprefix("export ").partition("=")
            self.env[name] = re.sub(r"\$(\w+)", lambda m: self.env.get(m[1], ""), value)  # as this shell has them
            return
        if command.endswith("&"):
            log = self.folder / f"background-{len(self.background)}.log"
            with open(log, "w") as out:
                process = subprocess.Popen(command[:-1], shell=True, cwd=self.folder, env=self.env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            self.background.append((process, log))
        else:
            result = subprocess.run(command, shell=True, cwd=self.folder, env=self.env, capture_output=True,
                                    text=True, timeout=TIMEOUT)
            assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stdout}{result.stderr}"
            for text in prints:
                assert text in result.stdout + result.stderr, f"{command}: no {text!r}\n{result.stdout}"
        for text in waits:
            self.wait_for(text, command)

    def stop(self) -> None:
        for process, _ in reversed(self.background):  # as the reader would: Ctrl-C, the services last
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def steps(doc: str):
    """(kind, text) in the document's order: a file to save, or a shell command."""
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", doc, re.S):
        first = body.splitlines()[0]
        if lang == "sh":
            for line in body.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    yield "command", line
        elif first.startswith("# ") and "." in first:
            yield "file", body


def test_the_first_app_walkthrough_runs_as_written(tmp_path):
    walk = Walkthrough(tmp_path)
    saved = []
    try:
        for kind, text in steps(DOC):
            if kind == "file":
                name = text.splitlines()[0].removeprefix("# ").strip()
                (tmp_path / name).write_text(text)
                saved.append(name)
            else:
                walk.run(text)
        assert saved == ["topology.yaml", "billing.py", "shop.py"]
        billed = re.findall(r"billed order \S+: (\d+) for (\w+)", walk.output())
        assert billed == [("42", "alice"), ("7", "bob")], "each order billed once, the rejected one after its replay"
        import psycopg

        with psycopg.connect(walk.env["BILLING_DATABASE_URL"]) as conn:  # billing's writes, with its record
            assert sorted(conn.execute("SELECT customer, total FROM invoices").fetchall()) == [("alice", 42), ("bob", 7)]
            assert conn.execute("SELECT count(*) FROM seamq_handled").fetchone()[0] == 2
    finally:
        walk.stop()
        # `seamq dev` keeps PostgreSQL's files in .seamq/ (as root, in the runtime folder: see embedded.py).
        shutil.rmtree(PostgresServer(tmp_path / ".seamq" / "pg").data_dir, ignore_errors=True)
    assert all(p.returncode is not None for p, _ in walk.background)
