"""Args sealed by a client and opened by a worker (seamq.jobs.sealing), as the official Python SDK's
encryption middleware seals them: each side opens what the other sealed."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from ojs.encryption import EncryptionCodec, StaticKeyProvider, encryption_middleware
from ojs.job import JobRequest

from seamq.jobs import sealing
from seamq.jobs.sealing import Keys, Unopenable

OLD, NEW = bytes(range(32)), bytes(range(1, 33))
KEYS = Keys.parse(f"v2:{base64.b64encode(NEW).decode()},v1:{base64.b64encode(OLD).decode()}")


def test_keys_are_read_as_id_and_base64_and_a_wrong_one_is_refused_without_showing_it():
    assert KEYS.current == "v2" and KEYS.get("v1") == OLD
    secret = base64.b64encode(b"x" * 16).decode()
    for bad in ("", "v1", f"v1:{secret}", "v1:not base64!", f":{base64.b64encode(NEW).decode()}"):
        with pytest.raises(ValueError) as refused:
            Keys.parse(bad)
        assert secret not in str(refused.value)


def test_a_job_sealed_here_holds_no_plaintext_and_opens_with_its_key_only():
    body = sealing.sealed({"type": "mail.send", "args": ["ada@example.com", {"card": "4111"}], "meta": {"a": 1}}, KEYS)
    text = json.dumps(body)
    assert "ada@example.com" not in text and "4111" not in text
    assert body["meta"]["a"] == 1 and body["meta"][sealing.KEY_ID] == "v2" and len(body["args"]) == 1
    assert sealing.opened(body, KEYS) == ["ada@example.com", {"card": "4111"}]
    with pytest.raises(Unopenable, match="key 'v2', which this worker does not have"):
        sealing.opened(body, Keys.parse(f"v1:{base64.b64encode(OLD).decode()}"))
    with pytest.raises(Unopenable, match="does not have"):
        sealing.opened(body, None)
    altered = {**body, "args": [base64.b64encode(b"x" * 40).decode()]}
    with pytest.raises(Unopenable, match="do not open"):
        sealing.opened(altered, KEYS)
    for hostile in ([5], [], ["%%%"], [None]):
        with pytest.raises(Unopenable):
            sealing.opened({**body, "args": hostile}, KEYS)
    assert sealing.opened({"args": [1, 2]}, None) == [1, 2]  # not sealed: as it is


def test_the_official_sdk_opens_what_seamq_seals_and_seamq_what_the_sdk_seals():
    codec = EncryptionCodec(StaticKeyProvider({"v1": OLD, "v2": NEW}, current_key="v2"))
    body = sealing.sealed({"type": "t", "args": [1, "two"]}, KEYS)
    meta = body["meta"]
    plain = codec.decrypt(base64.b64decode(body["args"][0]), base64.b64decode(meta[sealing.NONCE]), meta[sealing.KEY_ID])
    assert json.loads(plain) == [1, "two"]

    request = JobRequest(type="t", args=[{"ssn": "078-05-1120"}])

    async def sent(req):
        return req
    asyncio.run(encryption_middleware(codec)(request, sent))
    assert "078-05-1120" not in json.dumps(request.args)
    assert sealing.opened({"id": "j", "args": request.args, "meta": request.meta}, KEYS) == [{"ssn": "078-05-1120"}]
