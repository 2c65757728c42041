"""Job args encrypted by the client that enqueues them and opened by the worker that runs them (OJS
encryption, the official SDKs' `encryption_middleware` and `decryption_middleware`): the job
server, its store and the console only ever hold the ciphertext.

AES-256-GCM, as the SDKs: the args as JSON, encrypted with the current key and a random 12-byte
nonce, become one base64 string, `args: [ciphertext]`; `meta` says how (`ojs.codec.encodings:
["binary/encrypted"]`, `ojs.codec.key_id`, `ojs.codec.nonce`), so a job sealed by an SDK is opened
here and the reverse. Keys come from SEAMQ_JOBS__ENCRYPTION_KEYS (`id:base64key`, comma-separated,
the first one seals; the others still open, for rotation). A job's result is stored as its function
returns it. No I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ENCODINGS, KEY_ID, NONCE = "ojs.codec.encodings", "ojs.codec.key_id", "ojs.codec.nonce"
ENCRYPTED = "binary/encrypted"
LEGACY = ("ojs_encoded", "ojs_key_id", "ojs_nonce")  # the SDKs' names before the codec spec, still read


class Unopenable(Exception):
    """A sealed job this worker cannot open: no key of its id here, or its ciphertext does not match."""


@dataclass(frozen=True)
class Keys:
    current: str
    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def parse(cls, text: str) -> "Keys":
        """`id:base64key,...`; ValueError saying what is wrong (never the key)."""
        found: list[tuple[str, bytes]] = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key_id, sep, encoded = part.partition(":")
            try:
                key = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                key = b""
            if not sep or not key_id or len(key) != 32:
                raise ValueError(f"encryption key {key_id or '?'!r}: give id:key, the key 32 bytes in base64 "
                                 "(python -c 'import os, base64; print(base64.b64encode(os.urandom(32)).decode())')")
            found.append((key_id, key))
        if not found:
            raise ValueError("no encryption key given")
        return cls(found[0][0], tuple(found))

    def get(self, key_id: str) -> bytes | None:
        return dict(self.keys).get(key_id)


def sealed(body: dict[str, Any], keys: Keys) -> dict[str, Any]:
    """A push body with its args encrypted with the current key and `meta` saying how."""
    nonce = os.urandom(12)
    ciphertext = AESGCM(dict(keys.keys)[keys.current]).encrypt(nonce, json.dumps(body.get("args", [])).encode(), None)
    meta = {**(body.get("meta") or {}), ENCODINGS: [ENCRYPTED], KEY_ID: keys.current,
            NONCE: base64.b64encode(nonce).decode()}
    return {**body, "args": [base64.b64encode(ciphertext).decode()], "meta": meta}


def is_sealed(job: dict[str, Any]) -> bool:
    meta = job.get("meta") or {}
    encodings = meta.get(ENCODINGS)
    return isinstance(encodings, list) and ENCRYPTED in encodings or bool(meta.get(LEGACY[0]))


def opened(job: dict[str, Any], keys: Keys | None) -> list[Any]:
    """A job's args as its client gave them: opened when sealed, else as they are. Unopenable says why."""
    args = job.get("args") or []
    if not is_sealed(job):
        return list(args)
    meta = job["meta"]
    key_id = meta.get(KEY_ID) or meta.get(LEGACY[1]) or ""
    key = keys.get(key_id) if keys is not None else None
    if key is None:
        raise Unopenable(f"job {job.get('id')}'s args are encrypted with key {key_id!r}, which this worker does not "
                         "have (SEAMQ_JOBS__ENCRYPTION_KEYS)")
    try:
        nonce = base64.b64decode(meta.get(NONCE) or meta.get(LEGACY[2]) or "", validate=True)
        plain = AESGCM(key).decrypt(nonce, base64.b64decode(args[0], validate=True), None)
        found = json.loads(plain)
    except (IndexError, TypeError, ValueError, binascii.Error, InvalidTag):
        raise Unopenable(f"job {job.get('id')}'s encrypted args do not open with key {key_id!r} (altered, or "
                         "another key of that id)") from None
    if not isinstance(found, list):
        raise Unopenable(f"job {job.get('id')}'s encrypted args are not a JSON array")
    return found
