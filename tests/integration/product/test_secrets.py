"""Secrets never appear in output: every command's error paths and --help, with credentials
configured in the DSN (URL and key=value forms), the NATS URL, token and handler secret."""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from seamq.embedded import free_port
from seamq.redact import redact, register

from helpers import SEAMQ

CLOSED = free_port()  # nothing listens here
PIECES = ("Xq7pw", "Zr8-S3cret", "Wv9pw")  # one password with spaces: a parser may quote any piece
SPACED = " ".join(PIECES)
SECRETS = ("Dsn-S3cret-1", "Nats-S3cret-2", "Dsn-S3cret-4", "Tok-S3cret-7", "Hmac-S3cret-8", "Npw-S3cret-9",
           *PIECES)
ALWAYS = dict(SEAMQ_NATS__TOKEN="Tok-S3cret-7", SEAMQ_CONSUMER__HANDLER_SECRET="Hmac-S3cret-8",
              SEAMQ_NATS__PASSWORD="Npw-S3cret-9")

CONFIGS = {
    "dsn typo": dict(SEAMQ_DATABASE_URL="postgresql//seamq:Dsn-S3cret-1@127.0.0.1/db",
                     SEAMQ_NATS__URL=f"nats://natsuser:Nats-S3cret-2@127.0.0.1:{CLOSED}"),
    "dsn password with spaces": dict(SEAMQ_DATABASE_URL=f"postgresql://seamq:{SPACED}@127.0.0.1:{CLOSED}/db"),
    "nats url with a wrong scheme": dict(SEAMQ_NATS__URL="http://natsuser:Nats-S3cret-2@127.0.0.1:4222",
                                         SEAMQ_DATABASE_URL=f"postgresql://seamq:Dsn-S3cret-4@127.0.0.1:{CLOSED}/db"),
    "database unreachable": dict(SEAMQ_DATABASE_URL=f"postgresql://seamq:Dsn-S3cret-4@127.0.0.1:{CLOSED}/db",
                                 SEAMQ_NATS__URL=f"nats://natsuser:Nats-S3cret-2@127.0.0.1:{CLOSED}"),
    "conninfo unreachable": dict(
        SEAMQ_DATABASE_URL=f"host=127.0.0.1 port={CLOSED} user=seamq password='{SPACED}' dbname=db"),
}
# The configurations that fail as settings load (before any connection or JVM).
FAILS_AT_LOAD = ("dsn typo", "dsn password with spaces", "nats url with a wrong scheme")

COMMANDS = [
    ["relay"], ["consume", "--consumer", "sea__from_vibespro", "--handler-url", "http://127.0.0.1:9/handle"],
    ["replay"], ["provision"], ["provision", "--dry-run"], ["backlog"], ["db", "status"], ["db", "upgrade"],
    ["dlq", "list"], ["dlq", "show", "6f1c3a52-7a43-4c38-9d2c-0f3c1b9e8a11"], ["dlq", "replay", "--all"],
    ["dlq", "purge"], ["outbox", "purge", "--older-than", "7d"], ["inbox", "purge", "--older-than", "60d"],
]
SPARK_COMMANDS = [
    ["pipeline", "kpis"], ["pipeline", "reconcile"], ["pipeline", "lake", "--stream", "SEA_EVENTS"],
    ["pipeline", "replay", "--since", "2026-11-20T10:00", "--until", "2026-11-20T11:00"],
]
HELP = [[], ["dev"], ["provision"], ["relay"], ["consume"], ["replay"], ["backlog"], ["db"], ["db", "status"],
        ["db", "upgrade"], ["dlq"], ["dlq", "list"], ["dlq", "show"], ["dlq", "replay"], ["dlq", "purge"],
        ["registry"], ["registry", "generate"], ["registry", "check"], ["pipeline"], ["pipeline", "lake"],
        ["pipeline", "kpis"], ["pipeline", "reconcile"], ["pipeline", "replay"], ["outbox", "purge"],
        ["inbox", "purge"]]


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


async def _run(argv: list[str], env: dict, limit: asyncio.Semaphore, cwd) -> tuple[int, str]:
    async with limit:
        proc = await asyncio.create_subprocess_exec(*SEAMQ, *argv, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        except asyncio.TimeoutError:
            proc.kill()
            out, _ = await proc.communicate()
            return -9, out.decode(errors="replace")
        return proc.returncode, out.decode(errors="replace")


def _env(config: dict) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SEAMQ_")}
    return {**base, **ALWAYS, **config, "COLUMNS": "200"}


async def test_no_secret_in_any_error_path(tmp_path):
    limit = asyncio.Semaphore(4)
    runs = []
    for name, config in CONFIGS.items():
        commands = COMMANDS + (SPARK_COMMANDS if name in FAILS_AT_LOAD else [])
        runs += [(name, argv, _run(argv, _env(config), limit, tmp_path)) for argv in commands]
    results = await asyncio.gather(*(coro for _, _, coro in runs))
    problems = []
    for (name, argv, _), (code, out) in zip(runs, results):
        where = f"[{name}] seamq {' '.join(argv)} -> exit {code}"
        if leaks(out):
            problems.append(f"{where}: prints {leaks(out)}:\n{out[-1500:]}")
        elif code not in (1, 2) or "Traceback" in out or not re.search(r"error\[[A-Z_]+\]: ", out):
            problems.append(f"{where}: not a clean error[CODE] line:\n{out[-1500:]}")
        elif name in FAILS_AT_LOAD and not (code == 2 and "error[INVALID_CONFIG]" in out):
            problems.append(f"{where}: a configuration error must be error[INVALID_CONFIG], exit 2:\n{out[-800:]}")
    assert not problems, "\n\n".join(problems)


async def test_no_secret_in_help(tmp_path):
    limit = asyncio.Semaphore(4)
    env = _env(CONFIGS["database unreachable"])
    results = await asyncio.gather(*(_run([*argv, "--help"], env, limit, tmp_path) for argv in HELP))
    for argv, (code, out) in zip(HELP, results):
        assert code == 0 and "Usage" in out, (argv, out[-500:])
        assert not leaks(out), (argv, leaks(out))


@pytest.mark.parametrize("text, shown", [
    ("postgresql://app:s3cret@db:5432/x", "postgresql://app:***@db:5432/x"),
    ("missing \"=\" after \"postgresql//app:s3cret@db/x\" in connection info", "postgresql//app:***@db/x"),
    ("host=db password='two words' user=app", "password=*** user=app"),
    ("nats://u:p4ss@127.0.0.1:4222,nats://u:p4ss@127.0.0.2:4222", "nats://u:***@127.0.0.1:4222,nats://u:***@"),
])
def test_redact_masks_passwords_by_their_shape(text, shown):
    assert shown in redact(text) and "s3cret" not in redact(text) and "p4ss" not in redact(text)


def test_redact_masks_registered_secrets_and_their_pieces():
    register("Unique-Tok3n", "piece-one piece-two")
    assert redact("token Unique-Tok3n rejected; near 'piece-two@host'") == "token *** rejected; near '***@host'"
    assert redact("percent-encoded piece-one%20piece-two") == "percent-encoded ***"


def test_a_secret_is_masked_where_it_stands_never_inside_a_word():
    """A secret's text inside another word is that word, not the secret: masking every occurrence
    garbled messages ("ex***ected ***ostgresql://", issue 44)."""
    register("Pass-W0rd-Qz")
    assert redact("rejected Pass-W0rd-Qz; MyPass-W0rd-Qz2 and 'Pass-W0rd-Qz'") == \
        "rejected ***; MyPass-W0rd-Qz2 and '***'"
    assert redact("Authorization: Bearer abc.def-123, then authorization=Basic dXNlcjpwdw==") == \
        "Authorization: Bearer ***, then authorization=Basic ***"


@pytest.mark.parametrize("key, value", [
    ("SEAMQ_DATABASE_URL", "postgresql://user:p@127.0.0.1:5432/dbname"),
    ("SEAMQ_NATS__PASSWORD", "hunter2"),
    ("SEAMQ_CONSOLE__USERS", "a:b:admin"),
    ("SEAMQ_JOBS__TOKENS", "long-enough-token,short"),
])
def test_a_secret_too_short_to_be_one_is_refused_at_start(monkeypatch, key, value):
    from seamq.model import SeamqError
    from seamq.settings import load_settings

    monkeypatch.setenv(key, value)
    with pytest.raises(SeamqError) as refused:
        load_settings()
    assert refused.value.code.value == "INVALID_CONFIG"
    message = str(refused.value)
    assert "at least 8 characters" in message and "***" not in message, message
    assert key.removeprefix("SEAMQ_").lower().replace("__", ".") in message.lower() or key in message, message


async def test_a_handler_service_logs_the_traceback_of_a_500_without_its_secrets(caplog):
    """handler_app answered 500 and logged nothing; its log must not carry a password either."""
    import logging

    from seamq.http.server import handler_app
    from seamq.model import Event
    from seamq.testing import Harness

    async def failing(envelope):
        raise RuntimeError("could not reach postgresql://billing:hunter2-secret@db:5432/billing")

    with caplog.at_level(logging.WARNING, logger="seamq.handler"):
        outcome = await Harness().deliver_http(handler_app(failing, secret=None), Event(
            context="shop", aggregate_type="order", aggregate_id="o-1", event_type="order_placed", payload={}))
    assert outcome.retried
    logged = caplog.text
    assert "handler_raised" in logged and "Traceback" in logged and "RuntimeError: could not reach" in logged
    assert "hunter2-secret" not in logged
