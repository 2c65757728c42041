"""docs/deploy.md against the real thing: every command and flag parses as seamq's CLI parses
it, every SEAMQ_* name is a setting and every value is accepted, the probes point at paths and
ports the worker serves (on an address the kubelet can reach), and nats-server accepts the
cluster configuration."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from seamq.embedded import nats_server_binary
from seamq.settings import Settings, load_settings

from helpers.cli import parse_command

DOC = (Path(__file__).resolve().parents[3] / "docs" / "deploy.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", DOC, re.S)


def blocks(kind: str) -> list[str]:
    return [text for lang, text in BLOCKS if lang == kind]


def is_setting(name: str) -> bool:
    model: type[BaseModel] = Settings
    parts = name.removeprefix("SEAMQ_").lower().split("__")
    for part in parts:
        field = model.model_fields.get(part) if model else None
        if field is None:
            return False
        nested = isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        model = field.annotation if nested else None
    return True


def accepted(env: dict[str, str], monkeypatch) -> None:
    for key in [k for k in os.environ if k.startswith("SEAMQ_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    load_settings()  # raises SeamqError naming the bad key


def test_every_seamq_name_in_the_guide_is_a_setting():
    names = set(re.findall(r"\bSEAMQ_[A-Z0-9_]+", DOC))
    assert len(names) > 10
    assert sorted(n for n in names if not is_setting(n)) == []


def test_every_command_in_the_guide_parses():
    spans = [s for s in re.findall(r"`(seamq [^`]+)`", DOC) if "..." not in s]
    units = [line.split("=", 1)[1] for text in blocks("ini") for line in text.splitlines()
             if line.startswith(("ExecStart=", "ExecStartPre="))]
    assert len(spans) >= 5 and len(units) >= 5
    for command in spans + units:
        argv = shlex.split(command.replace("%i", "sea__from_vibespro"))
        parse_command(argv)


def test_systemd_environment_is_accepted(monkeypatch):
    env_file = next(text for text in blocks("ini") if "seamq.env" in text.splitlines()[0])
    env = dict(line.split("=", 1) for line in env_file.splitlines() if line and not line.startswith("#"))
    monkeypatch.chdir(Path(__file__).parent)
    accepted(env, monkeypatch)
    for text in blocks("ini"):
        extra = dict(line.removeprefix("Environment=").split("=", 1) for line in text.splitlines()
                     if line.startswith("Environment="))
        accepted({**env, **extra}, monkeypatch)
    assert env["SEAMQ_METRICS_HOST"] == "0.0.0.0"  # Prometheus scrapes from another machine


def containers(doc: dict) -> list[dict]:
    spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
    pod = spec["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def test_kubernetes_commands_settings_and_probes_match_the_worker(monkeypatch):
    docs = [d for text in blocks("yaml") for d in yaml.safe_load_all(text)]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "CronJob"}
    probed = 0
    for doc in (d for d in docs if d["kind"] != "Service"):
        for container in containers(doc):
            parse_command(container["command"])
            env = {e["name"]: e["value"] for e in container.get("env", [])}
            accepted(env, monkeypatch)
            for kind in ("livenessProbe", "readinessProbe"):
                probe = container.get(kind)
                if probe is None:
                    continue
                probed += 1
                if container["command"][1] == "jobs":  # the job server probes its own port
                    assert container["command"][2] == "serve"
                    argv = container["command"]
                    port, host = argv[argv.index("--port") + 1], argv[argv.index("--host") + 1]
                    assert host == "0.0.0.0" and str((probe.get("httpGet") or probe.get("tcpSocket"))["port"]) == port
                    assert kind == "livenessProbe" or probe["httpGet"]["path"] == "/ojs/v1/health"
                    continue
                assert container["command"][1] in ("relay", "consume", "replay")
                assert probe["httpGet"]["path"] == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}[kind]
                assert str(probe["httpGet"]["port"]) == env["SEAMQ_METRICS_PORT"]
                assert env["SEAMQ_METRICS_HOST"] == "0.0.0.0"  # the kubelet probes the pod's address
    assert probed == 6
    services = [d for d in docs if d["kind"] == "Service"]
    served = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for service in services:  # each Service selects a Deployment's pods, on a port they listen on
        pods = served[service["metadata"]["name"]]["spec"]["template"]
        assert service["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
        ports = {p["containerPort"] for c in pods["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


@pytest.mark.parametrize("text", blocks("conf"))
def test_nats_cluster_configuration_is_valid(tmp_path, text):
    config = tmp_path / "nats-server.conf"
    config.write_text(text)
    result = subprocess.run([nats_server_binary(), "-t", "-c", str(config)], capture_output=True, text=True,
                            env={"NATS_PASSWORD": "from-the-environment"})
    assert result.returncode == 0, result.stderr + result.stdout
    assert "cluster" in text and text.count("nats-route://") == 3
