"""seamq: transactional outbox, JetStream relay, inbox consumers and dead letters.

The public API for application code is small: `Event` or a typed
`EventModel`, `outbox.add` / `outbox.add_many`, and for handlers `Envelope`,
`Poison`, `AlreadyProcessed`, `Registry`, `Route`; tests use `seamq.testing`.
"""

from seamq import outbox
from seamq.envelope import AlreadyProcessed, Envelope, Poison
from seamq.model import ErrorCode, Event, EventSubject, SeamqError
from seamq.registry import Registry, Route
from seamq.typed import EventModel

__all__ = [
    "AlreadyProcessed", "Envelope", "ErrorCode", "Event", "EventModel", "EventSubject", "Poison", "Registry", "Route",
    "SeamqError", "outbox",
]
