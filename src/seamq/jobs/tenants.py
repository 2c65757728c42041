"""Tenants (OJS multi-tenancy): a job's tenant is its `meta.tenant_id`, given in the body or by the
`X-OJS-Tenant` header. No I/O.

seamq keeps the spec's hybrid model (its section 6.3, "sharded queues"): a queue's waiting jobs are
kept in a lane per tenant (seamq.jobs.ports.JobStore.take), a fetch without a tenant takes from
every lane of a priority in turn, and one with a tenant from its lane alone; each tenant's counts
are tallied beside its queue's, in the same commit (`tally_queue`).
"""

from __future__ import annotations

import re
from typing import Any

PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._:-]{0,254}$")
HEADER = "X-OJS-Tenant"
DEFAULT = "_default"  # the spec's name for the tenant of jobs that name none


def problem(meta: Any) -> str | None:
    """Why a job's `meta.tenant_id` cannot be taken; None when it can (or names none)."""
    if not isinstance(meta, dict) or meta.get("tenant_id") is None:
        return None
    if not isinstance(meta["tenant_id"], str) or not PATTERN.fullmatch(meta["tenant_id"]):
        return f"meta.tenant_id must match {PATTERN.pattern}"
    return None


def of(record: dict[str, Any] | None) -> str:
    """A job's tenant, "" for none (its lane is the queue's own)."""
    return of_meta((record or {}).get("meta"))


def of_meta(meta: dict[str, Any] | None) -> str:
    tenant = (meta or {}).get("tenant_id")
    return tenant if isinstance(tenant, str) and tenant != DEFAULT and PATTERN.fullmatch(tenant) else ""


def given(header: str | None) -> str | None:
    """The tenant a request names by its header: None for none, "" for the default tenant. Raises
    ValueError for one that cannot be a tenant."""
    if header is None or header == DEFAULT:
        return None if header is None else ""
    if not PATTERN.fullmatch(header):
        raise ValueError(f"{HEADER} must match {PATTERN.pattern}")
    return "" if header == DEFAULT else header


def stamped(body: Any, tenant: str | None) -> Any:
    """A push body with the header's tenant in `meta.tenant_id`; ValueError when the body names another."""
    if tenant is None or not isinstance(body, dict):
        return body
    meta: dict[str, Any] = body["meta"] if isinstance(body.get("meta"), dict) else {}
    named = meta.get("tenant_id")
    if named is not None and named != (tenant or DEFAULT):
        raise ValueError(f"meta.tenant_id {named!r} is not the tenant of the {HEADER} header, {tenant or DEFAULT!r}")
    return {**body, "meta": {**meta, "tenant_id": tenant or DEFAULT}} if tenant else body


def from_tally(name: str) -> tuple[str, str] | None:
    """(queue, tenant) of a name `tally_queue` made; None for a queue's own."""
    queue, _, tenant = name.partition("/")
    return (queue, tenant.replace("=", ".").replace("_", ":")) if tenant else None


def tally_queue(queue: str, tenant: str) -> str:
    """Where a tenant's counts of a queue are tallied (seamq.jobs.tally): a name no queue has (queues
    have no `/`; a tenant no `=` or `_`, so its `.` and `:` are written as those)."""
    return f"{queue}/{tenant.replace('.', '=').replace(':', '_')}"
