"""Typed events: one pydantic model per event version, declared once, checked on both sides.

    class VibeCreatedV1(EventModel, context="vibespro", name="vibe_created", version=1,
                        aggregate_type="vibe", aggregate_key="vibe_id"):
        vibe_id: str
        mood: str | None = None

    outbox.add(conn, VibeCreatedV1(vibe_id="v-1", mood="calm"))   # validated before the database

    async def on_vibe_created(envelope: Envelope[VibeCreatedV1], tx) -> None:
        envelope.payload.mood                                      # typed; a bad payload is dead-lettered

The model is the one source of truth for the version's payload: manifests
name it (`model: pkg.module:VibeCreatedV1`) and the registry takes its JSON
Schema from it, so the lock compares the model's schema across releases
(seamq.compat). Unknown fields are ignored, so a consumer on an older model
reads events that gained an optional field. No I/O here.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
import uuid
from datetime import datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from seamq.model import ErrorCode, Event, EventSubject, SeamqError, describe, validate_token


class EventModel(BaseModel):
    """Base class of typed event payloads; the class keywords say which event version it is."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    seamq_subject: ClassVar[EventSubject]
    seamq_aggregate_type: ClassVar[str | None]
    seamq_aggregate_key: ClassVar[str | None]

    def __init_subclass__(cls, *, context: str | None = None, name: str | None = None, version: int | None = None,
                          aggregate_type: str | None = None, aggregate_key: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if context is None and name is None and version is None:
            if hasattr(cls, "seamq_subject"):  # a subclass of a declared event: the same event
                return
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{cls.__name__}: declare the event it is with "
                             "class keywords context=, name= and version=")
        if context is None or name is None or version is None:
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{cls.__name__}: declare all three of context=, name= "
                             f"and version= (got {context!r}, {name!r}, {version!r})")
        cls.seamq_subject = EventSubject(context, name, version)  # validates all three
        cls.seamq_aggregate_type = validate_token(aggregate_type, "aggregate_type") if aggregate_type else None
        cls.seamq_aggregate_key = aggregate_key

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        key = cls.__dict__.get("seamq_aggregate_key")
        if key is not None and key not in cls.model_fields:
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{cls.__name__}: aggregate_key {key!r} is not one of its "
                             f"fields ({', '.join(cls.model_fields) or 'none'})")

    def event(self, aggregate_id: str | None = None, *, aggregate_type: str | None = None,
              id: uuid.UUID | None = None, occurred_at: datetime | None = None,
              correlation_id: uuid.UUID | None = None, causation_id: uuid.UUID | None = None,
              deliver_at: datetime | None = None) -> Event:
        """The outbox Event for this payload; the aggregate comes from the class keywords unless given."""
        cls = type(self)
        if aggregate_id is None and cls.seamq_aggregate_key:
            aggregate_id = str(getattr(self, cls.seamq_aggregate_key))
        aggregate_type = aggregate_type or cls.seamq_aggregate_type
        if not aggregate_id or not aggregate_type:
            raise SeamqError(ErrorCode.INVALID_OUTBOX, f"{cls.__name__}: the aggregate is unknown; declare "
                             "aggregate_type= and aggregate_key= on the class, or pass them to .event()")
        subject = cls.seamq_subject
        event = Event(context=subject.context, aggregate_type=aggregate_type, aggregate_id=aggregate_id,
                      event_type=subject.name, event_version=subject.version, payload=self,
                      correlation_id=correlation_id, causation_id=causation_id, deliver_at=deliver_at)
        if id is not None:
            event = dataclasses.replace(event, id=id)
        if occurred_at is not None:
            event = dataclasses.replace(event, occurred_at=occurred_at)
        return event

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema of the payload (what manifests and AsyncAPI documents carry)."""
        return cls.model_json_schema()


def payload_json(event: Event) -> Any:
    """The payload as JSON data: a model is dumped after checking it belongs to the event's subject."""
    payload = event.payload
    if not isinstance(payload, EventModel):
        return payload
    if type(payload).seamq_subject != event.subject:
        raise SeamqError(ErrorCode.INVALID_OUTBOX, f"payload is a {type(payload).__name__} "
                         f"({type(payload).seamq_subject}), but the event is {event.subject}")
    return payload.model_dump(mode="json")


def model_of_handler(fn: Any) -> type[EventModel] | None:
    """The model a handler asks for with `envelope: Envelope[SomeModel]`, else None."""
    from seamq.envelope import Envelope

    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # annotations that do not resolve: an untyped handler, as before...
        written = _envelope_annotation(fn)
        if written:  # ...unless it asks for a model: it would get dicts and fail on every message
            raise SeamqError(ErrorCode.INVALID_CONFIG, f"{getattr(fn, '__qualname__', fn)}: its annotation "
                             f"{written!r} does not resolve ({describe(exc)}); define the model "
                             "where the function's module can see it (at module level)") from None
        return None
    params = [h for name, h in hints.items() if name != "return"]
    if not params or typing.get_origin(params[0]) is not Envelope:
        return None
    (model,) = typing.get_args(params[0]) or (None,)
    return model if isinstance(model, type) and issubclass(model, EventModel) else None


def _envelope_annotation(fn: Any) -> str | None:
    """The first parameter's annotation when it is the text `Envelope[...]` (a postponed one)."""
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return None
    written = first.annotation if first is not None else None
    if isinstance(written, str) and written.replace(" ", "").startswith(("Envelope[", "seamq.Envelope[")):
        return written
    return None


def parse_payload(model: type[EventModel], payload: Any) -> EventModel | str:
    """The typed payload, or why the payload does not fit the model (field by field)."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}"
                         for e in exc.errors()[:5])
    except RecursionError:
        return "payload: nested too deeply to validate"


def typed_envelope(model: type[EventModel], envelope: Any) -> Any:
    """The envelope with its payload parsed into `model`, or why it cannot be (a str: a schema
    mismatch). The one rule for typed handlers, in-process (seamq.inprocess) and over HTTP
    (seamq.http.server)."""
    subject = model.seamq_subject
    if (envelope.context, envelope.event_type, envelope.event_version) != \
            (subject.context, subject.name, subject.version):
        return f"the handler takes {subject}, not {envelope.subject}"
    parsed = parse_payload(model, envelope.payload)
    return parsed if isinstance(parsed, str) else dataclasses.replace(envelope, payload=parsed, payload_json=None)
