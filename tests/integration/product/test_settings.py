import subprocess

import pytest

from seamq.model import ErrorCode, SeamqError
from seamq.settings import load_settings, redact_url

from helpers import SEAMQ


def test_env_and_yaml(monkeypatch, tmp_path):
    config = tmp_path / "seamq.yaml"
    config.write_text("nats:\n  url: nats://127.0.0.1:4333\nrelay:\n  batch_size: 100\n")
    monkeypatch.setenv("SEAMQ_CONFIG", str(config))
    monkeypatch.setenv("SEAMQ_RELAY__BATCH_SIZE", "250")  # env beats YAML
    monkeypatch.setenv("SEAMQ_NATS__PASSWORD", "hunter2-pw")
    settings = load_settings()
    assert settings.nats.url == "nats://127.0.0.1:4333"
    assert settings.relay.batch_size == 250
    assert settings.nats.password.get_secret_value() == "hunter2-pw"
    assert "hunter2-pw" not in repr(settings) and "hunter2-pw" not in str(settings.model_dump())


def test_bad_values_name_the_key(monkeypatch):
    monkeypatch.setenv("SEAMQ_RELAY__BATCH_SIZE", "0")
    with pytest.raises(SeamqError) as err:
        load_settings()
    assert err.value.code == ErrorCode.INVALID_CONFIG and "relay.batch_size" in err.value.message
    monkeypatch.delenv("SEAMQ_RELAY__BATCH_SIZE")
    monkeypatch.setenv("SEAMQ_NATS__URL", "http://example")
    with pytest.raises(SeamqError, match="nats.url"):
        load_settings()


def test_redact_url():
    assert redact_url("postgresql://app:s3cret@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert redact_url("postgresql://app@db/x") == "postgresql://app@db/x"


def test_secrets_never_reach_help_or_errors(tmp_path):
    env = {"SEAMQ_NATS__PASSWORD": "hunter2-pw", "SEAMQ_DATABASE_URL": "postgresql://u:hunter2-pw@127.0.0.1:1/x",
           "PATH": "/usr/bin:/bin"}
    for args in (["--help"], ["relay", "--help"], ["db", "status"]):
        result = subprocess.run([*SEAMQ, *args], capture_output=True, text=True, env=env)
        assert "hunter2-pw" not in result.stdout + result.stderr, args


def test_unreachable_services_give_coded_errors():
    env = {"SEAMQ_DATABASE_URL": "postgresql://u@127.0.0.1:1/x", "SEAMQ_NATS__URL": "nats://127.0.0.1:1",
           "SEAMQ_NATS__CONNECT_TIMEOUT": "1", "PATH": "/usr/bin:/bin"}
    db = subprocess.run([*SEAMQ, "db", "status"], capture_output=True, text=True, env=env)
    assert db.returncode == 1 and "DATABASE_UNAVAILABLE" in db.stderr and "Traceback" not in db.stderr
    broker = subprocess.run([*SEAMQ, "provision", "--dry-run"], capture_output=True, text=True, env=env)
    assert broker.returncode == 1 and "BROKER_UNAVAILABLE" in broker.stderr and "Traceback" not in broker.stderr


def test_help_lists_groups_each_with_help():
    result = subprocess.run([*SEAMQ, "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for group in ["db", "outbox", "inbox", "provision", "relay", "consume", "backlog", "dev"]:
        assert group in result.stdout
        sub = subprocess.run([*SEAMQ, group, "--help"], capture_output=True, text=True)
        assert sub.returncode == 0 and "Usage" in sub.stdout, group


def test_credential_and_tls_files_are_checked_at_start(tmp_path):
    """A missing CA or .creds file is a configuration error naming the setting, not "cannot reach NATS"
    and not a traceback (nats-py needs the nkeys package for .creds: a dependency)."""
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n")
    for key, value in [("SEAMQ_NATS__TLS_CA", str(tmp_path / "missing-ca.pem")),
                       ("SEAMQ_NATS__CREDS_FILE", str(tmp_path / "missing.creds")),
                       ("SEAMQ_NATS__NKEY_SEED_FILE", str(tmp_path))]:  # a folder is no file either
        env = {"SEAMQ_NATS__URL": "nats://127.0.0.1:1", key: value, "PATH": "/usr/bin:/bin"}
        result = subprocess.run([*SEAMQ, "provision", "--dry-run"], capture_output=True, text=True, env=env)
        setting = key.removeprefix("SEAMQ_").replace("__", ".").lower()
        assert result.returncode != 0 and "error[INVALID_CONFIG]" in result.stderr, result.stderr
        assert setting in result.stderr and "Traceback" not in result.stderr, result.stderr
    env = {"SEAMQ_NATS__URL": "nats://127.0.0.1:1", "SEAMQ_NATS__CREDS_FILE": str(creds),
           "SEAMQ_NATS__CONNECT_TIMEOUT": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([*SEAMQ, "provision", "--dry-run"], capture_output=True, text=True, env=env)
    assert "BROKER_UNAVAILABLE" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_liveness_window_must_outlast_a_handler_call():
    with pytest.raises(SeamqError) as err:
        load_settings(health_stale_after=5, consumer={"handler_timeout": 10})
    assert err.value.code is ErrorCode.INVALID_CONFIG and "consumer.handler_timeout" in err.value.message


def test_a_cluster_is_a_yaml_list_or_comma_separated(tmp_path, monkeypatch):
    config = tmp_path / "seamq.yaml"
    config.write_text("nats:\n  url: [nats://127.0.0.1:4222, nats://127.0.0.1:4223]\n")
    monkeypatch.setenv("SEAMQ_CONFIG", str(config))
    assert load_settings().nats.url == "nats://127.0.0.1:4222,nats://127.0.0.1:4223"
    monkeypatch.setenv("SEAMQ_NATS__URL", "nats://a:4222,ftp://b:4222")
    with pytest.raises(SeamqError) as err:
        load_settings()
    assert "'ftp://b:4222' is not a nats://" in err.value.message


def test_a_poison_is_not_replayed_by_default_as_the_readme_says():
    """The README says a Poison is "dead-lettered, not retried"; the replay worker replayed it five times."""
    from seamq.settings import ReplaySettings

    assert ReplaySettings().policy().reasons == ("max_deliver",)


def test_the_settings_page_lists_every_setting_seamq_reads_each_described():
    """docs/settings.md is generated from the model: a setting added, renamed or left undescribed fails here."""
    from pathlib import Path

    from seamq.settings import reference

    table = reference()
    assert (Path(__file__).resolve().parents[3] / "docs" / "settings.md").read_text().endswith(table), \
        "docs/settings.md is not what seamq.settings.reference() says: regenerate its table"
    assert "| None |" not in table and "SEAMQ_CONSUMER__HANDLER_TIMEOUT" in table and "SEAMQ_EMBEDDED__PG_PORT" in table


def test_a_list_not_written_as_json_is_a_coded_error(monkeypatch):
    from seamq.model import SeamqError

    monkeypatch.setenv("SEAMQ_REPLAY__REASONS", "max_deliver,consumer_error")
    with pytest.raises(SeamqError) as refused:
        load_settings()
    assert refused.value.code.value == "INVALID_CONFIG" and "JSON" in str(refused.value)
