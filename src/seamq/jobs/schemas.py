"""The schema registry (`urn:ojs:ext:schema-registry`): a JSON Schema per job type and version. No I/O.

Two ways to address one schema, both kept: the conformance suite's
`/admin/schemas/{type}/{version}` (versions are integers there) and the SDKs'
`/schemas` by `uri` (versions are strings such as "1.0.0"). A record holds
type, version, uri and the schema, stored under `schema.{hex type}.{hex version}`.
A job that names a registered schema (`"schema": uri`) has its args validated
against it at enqueue; a job that names none is not checked. A schema without
`$schema` is read as draft 7, whose array form of `items` (one schema per
argument) is what the suite's schemas use.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from jsonschema import Draft7Validator, SchemaError
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from seamq.jobs.model import TYPE_PATTERN, OjsError, invalid, iso

MAX_VERSION = 64


def version_of(text: Any) -> int | str:
    """An integer when it is one (the suite asserts `"version": 1`), else the string as given."""
    if isinstance(text, bool) or not isinstance(text, (int, str)) or (isinstance(text, str) and not text):
        raise invalid("version must be an integer or a version string such as 1.0.0")
    if isinstance(text, str) and text.isdigit():
        return int(text)
    if isinstance(text, str) and (len(text) > MAX_VERSION or not re.fullmatch(r"[\w.+-]+", text)):
        raise invalid(f"version {text[:MAX_VERSION]!r} must be letters, digits and . + - _ only")
    return text


def order(version: int | str) -> tuple:
    """Latest = highest: 2 > 1, 1.10.0 > 1.9.0; numbers before names at each place."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+-]", str(version)))


def key(job_type: str, version: int | str) -> str:
    return f"schema.{job_type.encode().hex()}.{str(version).encode().hex()}"


def new(job_type: Any, version: Any, body: Any, now: datetime, uri: Any = None) -> dict:
    if not isinstance(job_type, str) or not TYPE_PATTERN.fullmatch(job_type):
        raise invalid(f"type {job_type!r} must be a job type such as email.send")
    version = version_of(version)
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object with a schema")
    schema = body.get("schema")
    if not isinstance(schema, dict):
        raise invalid("schema is required: a JSON Schema object")
    try:
        validator_for(schema, default=Draft7Validator).check_schema(schema)
    except SchemaError as exc:
        raise invalid(f"schema is not a valid JSON Schema: {exc.message}") from None
    if uri is None:
        uri = f"urn:ojs:schema:{job_type}:{version}"
    if not isinstance(uri, str) or not uri or len(uri) > 500:
        raise invalid("uri must be a non-empty string of at most 500 characters")
    return {"_key": key(job_type, version), "_kind": "schema", "type": job_type, "version": version, "uri": uri,
            "schema": schema, "created_at": iso(now)}


def from_sdk(body: Any, now: datetime) -> dict:
    """`POST /schemas` as the SDKs send it: `{uri, type, version, schema}`."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return new(body.get("type"), body.get("version"), body, now, uri=body.get("uri"))


def public(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("_")}


def check_args(record: dict, args: list) -> None:
    """A job's args against the schema it names: 400 with the first reason, as a person reads it."""
    validator = validator_for(record["schema"], default=Draft7Validator)
    error = best_match(validator(record["schema"]).iter_errors(args))
    if error is not None:
        where = "args" + "".join(f"[{p!r}]" for p in error.absolute_path)
        raise OjsError(400, "invalid_request", f"{where} does not match schema {record['uri']}: {error.message}",
                       details={"schema": record["uri"], "path": list(error.absolute_path)})
