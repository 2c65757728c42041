"""An AsyncAPI 3.0 document of what flows between the contexts, from the topology and the manifests.

The manifests already say which event versions exist and what their payloads
look like (schemas, or typed models); the topology says where they travel.
This writes both down in the form other teams' tools read: a channel per
event subject and version (with `.b{bucket}` where a context is
partitioned), one per consumer's dead letters, the headers every event
carries, the relay's `send` and each consumer's `receive` operations. No I/O:
`seamq asyncapi` reads the files and prints the result.
"""

from __future__ import annotations

import json
from typing import Any

from seamq.envelope import Reason
from seamq.model import BUCKETS, Header
from seamq.registry import Route
from seamq.topology import Topology

_UUID = {"type": "string", "format": "uuid"}

HEADERS = {
    "type": "object",
    "required": [Header.MSG_ID, Header.AGGREGATE_TYPE, Header.AGGREGATE_ID, Header.OCCURRED_AT],
    "properties": {
        Header.MSG_ID: {**_UUID, "description": "The outbox id: JetStream's de-duplication key and the inbox's."},
        Header.AGGREGATE_TYPE: {"type": "string"},
        Header.AGGREGATE_ID: {"type": "string", "description": "Events of one aggregate are delivered in order."},
        Header.OCCURRED_AT: {"type": "string", "format": "date-time"},
        Header.CORRELATION_ID: _UUID,
        Header.CAUSATION_ID: _UUID,
        Header.TRACEPARENT: {"type": "string", "description": "W3C trace context of the writer's span."},
    },
}

DEAD_LETTER = {
    "type": "object",
    "description": "EVT-047-002 MessageDeadLettered: why, and the original, embedded or where to read it.",
    "required": ["original_subject", "reason", "detail", "attempts", "consumer", "dead_lettered_at"],
    "properties": {
        "message_id": {**_UUID, "type": ["string", "null"]},
        "original_subject": {"type": "string"},
        "reason": {"type": "string", "enum": [r.value for r in Reason]},
        "detail": {"type": "string", "maxLength": 2000},
        "attempts": {"type": "integer"},
        "consumer": {"type": "string"},
        "original_stream": {"type": ["string", "null"]},
        "stream_seq": {"type": ["integer", "null"]},
        "dead_lettered_at": {"type": "string", "format": "date-time"},
        "original_headers": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        "original_payload": {"type": ["string", "null"]},
        "original_payload_encoding": {"type": "string", "enum": ["utf-8", "base64", "stream"]},
    },
}


def document(topology: Topology, subscriptions: list[tuple[str, Route]], *, version: str,
             servers: list[str] | None = None, title: str = "seamq events") -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document: `subscriptions` are (consuming context, route) from the manifests."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {"EventHeaders": HEADERS}
    events = sorted({(r.source, r.event_type, r.version): r for _, r in subscriptions if r.source}.items())
    for (source, event, number), route in events:
        key = f"{source}.{event}.v{number}"
        payload = _hoisted(json.loads(route.schema), key, schemas) if route.schema else {"type": "object"}
        messages[key] = {
            "name": key, "title": f"{event} v{number} ({source})", "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/EventHeaders"}, "payload": payload,
        }
        channel = {
            "address": f"{source}.event.{event}.v{number}",
            "title": f"{source}: {event} v{number}",
            "messages": {key: {"$ref": f"#/components/messages/{key}"}},
        }
        if topology.partitioned(source):
            channel["address"] += ".b{bucket}"
            channel["parameters"] = {"bucket": {
                "description": f"The aggregate's bucket, 0-{BUCKETS - 1}: the partition that takes it."}}
        channels[key] = channel
        if source in topology.contexts:
            operations[f"relay_{source}_sends_{event}_v{number}"] = {
                "action": "send", "channel": {"$ref": f"#/channels/{key}"},
                "summary": f"The relay publishes {source}'s outbox rows (stream "
                           f"{topology.contexts[source].stream.name}).",
                "messages": [{"$ref": f"#/channels/{key}/messages/{key}"}],
            }
    consumed = {(context, r.source, r.event_type, r.version) for context, r in subscriptions if r.source}
    for name, spec in sorted(topology.consumers.items()):
        mine = sorted((s, e, v) for c, s, e, v in consumed if c == spec.target and s == spec.source)
        for source, event, number in mine:
            key = f"{source}.{event}.v{number}"
            operations[f"{name}_receives_{event}_v{number}"] = {
                "action": "receive", "channel": {"$ref": f"#/channels/{key}"},
                "summary": f"Durable consumer {name} ({spec.target}) handles it, once, in its aggregate's order.",
                "messages": [{"$ref": f"#/channels/{key}/messages/{key}"}],
            }
        dlq = f"{name}.dlq"
        channels[dlq] = {
            "address": f"{spec.target}.dlq.{spec.source}.{{event}}",
            "title": f"Dead letters of {name}",
            "description": f"In stream {topology.contexts[spec.target].dlq.name}; `event` is the original's "
                          "`{event type}.v{version}`, or `_invalid` when its subject was not an event subject.",
            "parameters": {"event": {"description": "The original's event type and version."}},
            "messages": {"dead_letter": {"$ref": "#/components/messages/dead_letter"}},
        }
        operations[f"{name}_dead_letters"] = {
            "action": "send", "channel": {"$ref": f"#/channels/{dlq}"},
            "summary": f"{name} dead-letters what it can never handle (seamq dlq list / replay).",
            "messages": [{"$ref": f"#/channels/{dlq}/messages/dead_letter"}],
        }
    messages["dead_letter"] = {
        "name": "dead_letter", "title": "A dead letter", "contentType": "application/json",
        "headers": {"type": "object", "required": [Header.MSG_ID, Header.DLQ_REASON], "properties": {
            Header.MSG_ID: {"type": "string"}, Header.DLQ_REASON: {"type": "string"}}},
        "payload": DEAD_LETTER,
    }
    doc: dict[str, Any] = {
        "asyncapi": "3.0.0",
        "info": {"title": title, "version": version,
                 "description": "Events between bounded contexts through seamq: transactional outbox, NATS "
                                "JetStream, inbox consumers. Generated by `seamq asyncapi`."},
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }
    if servers:
        doc["servers"] = {f"nats{i + 1}": _server(url) for i, url in enumerate(servers)}
    return doc


def _hoisted(schema: dict[str, Any], key: str, schemas: dict[str, Any]) -> dict[str, Any]:
    """A payload schema whose `$defs` (pydantic's nested models) move to components.schemas as
    `{key}.{Name}`: a `#/$defs/...` reference would point at the document's root."""
    defs = schema.pop("$defs", {})

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                node = {**node, "$ref": f"#/components/schemas/{key}.{ref[len('#/$defs/'):]}"}
            return {k: rewrite(v) for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    for name, definition in defs.items():
        schemas[f"{key}.{name}"] = rewrite(definition)
    return rewrite(schema)


def _server(url: str) -> dict[str, str]:
    scheme, _, rest = url.partition("://")
    host = rest.rsplit("@", 1)[-1]  # never a user or password in the document
    return {"host": host, "protocol": "nats", **({"description": "TLS"} if scheme == "tls" else {})}
