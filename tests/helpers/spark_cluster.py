"""A Spark standalone cluster for tests: a master and two workers, each a process of its own
started from the installed pyspark, on 127.0.0.1, whose executors share nothing with the driver.

The executors run a Python of their own: a venv made from the base interpreter, with the
driver's third-party packages hard-linked in and seamq left out, so seamq's code can only
reach them with the job. As root, each worker also runs in a mount namespace of its own in
which the project checkout and the driver's virtualenv are hidden under empty tmpfs mounts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import seamq
from seamq.embedded import free_port

CHECKOUT = Path(seamq.__file__).resolve().parents[2]
_DRIVER = {CHECKOUT, Path(sys.prefix).resolve()}
HIDDEN = [p for p in _DRIVER if not any(o in p.parents for o in _DRIVER)]  # the outermost of the driver's folders


def executor_python(root: Path) -> Path:
    """A Python for executors without seamq: the base interpreter in a venv of its own, the driver's
    packages hard-linked (copied across file systems) except seamq's."""
    python = root / "bin" / "python"
    if python.exists():
        return python
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    target = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for entry in site.iterdir():
        if "seamq" in entry.name or entry.name in ("__pycache__", "_pytest", "pip"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, target / entry.name, copy_function=_link, symlinks=True)
        else:
            _link(entry, target / entry.name)
    return python


def _can_hide() -> bool:
    """Root, allowed to make mount namespaces (a container without CAP_SYS_ADMIN is not)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--mount", "true"], capture_output=True).returncode == 0


def _link(source, target) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class SparkCluster:
    def __init__(self, root: Path, workers: int = 2) -> None:
        self.root = root
        self.python = executor_python(root / "executor-python")
        self.spark_home = self.python.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
            / "site-packages" / "pyspark"
        self.port, self.ui_port = free_port(), free_port()
        self.workers = workers
        self.isolated = _can_hide()
        self.procs: list[subprocess.Popen] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SEAMQ_", "PYSPARK_", "SPARK_", "VIRTUAL_ENV"))}
        env.update(SPARK_HOME=str(self.spark_home), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
                   PATH=f"{self.python.parent}:/usr/local/bin:/usr/bin:/bin",
                   SPARK_LOG_DIR=str(self.root / "logs"), SPARK_WORKER_DIR=str(self.root / "work"),
                   # scratch in our folder: stop() kills, so the JVMs' own clean-up of /tmp never runs
                   SPARK_LOCAL_DIRS=str(self.root / "local"), SPARK_DAEMON_JAVA_OPTS=f"-Djava.io.tmpdir={self.tmp}")
        return env

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def _start(self, argv: list[str], log: Path) -> None:
        with open(log, "ab") as out:
            self.procs.append(subprocess.Popen(argv, env=self._env(), cwd=self.root, stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 90) -> "SparkCluster":
        for folder in ("logs", "local", "tmp"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        spark_class = str(self.spark_home / "bin" / "spark-class")
        self._start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui_port)], self.root / "logs" / "master.log")
        for i in range(self.workers):
            work = self.root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            worker = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                      "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g", "--work-dir", str(work),
                      self.master]
            if self.isolated:  # its own mount namespace: the driver's folders are empty there
                hide = " && ".join(f'mount -t tmpfs -o size=1m,mode=0755 tmpfs "{path}"' for path in HIDDEN)
                worker = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{hide} && exec "$@"',
                          "hide", *worker]
            self._start(worker, self.root / "logs" / f"worker-{i}.log")
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.stop()
                logs = "\n".join(f"{p.name}:\n{p.read_text()[-2000:]}" for p in (self.root / "logs").iterdir())
                raise RuntimeError(f"Spark cluster not up with {self.workers} workers:\n{logs}")
            time.sleep(0.5)
        return self

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as answer:
                state = json.load(answer)
        except OSError:
            return 0
        except ValueError:  # a page instead of the state (seen once while the cluster started): asked again
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def settings_env(self) -> dict[str, str]:
        """What `seamq pipeline ... --master` needs to use this cluster, as a user would set it."""
        return {"SEAMQ_PIPELINE__MASTER": self.master, "SEAMQ_PIPELINE__EXECUTOR_PYTHON": str(self.python),
                "SEAMQ_PIPELINE__DRIVER_HOST": "127.0.0.1", "SEAMQ_PIPELINE__DRIVER_BIND_ADDRESS": "127.0.0.1",
                "SEAMQ_PIPELINE__CONF": json.dumps({"spark.executor.memory": "512m", "spark.cores.max": "2",
                                                    "spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={self.tmp}"}),
                "SPARK_LOCAL_IP": "127.0.0.1"}
