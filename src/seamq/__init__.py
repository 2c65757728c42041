"""seamq: transactional outbox, JetStream relay, inbox consumers and dead letters.

The public API for application code is small: `Event`, `outbox.add` /
`outbox.add_many`, and for handlers `Envelope`, `Poison`, `AlreadyProcessed`,
`Registry`, `Route`.
"""

from seamq import outbox
from seamq.envelope import AlreadyProcessed, Envelope, Poison
from seamq.model import ErrorCode, Event, EventSubject, SeamqError
from seamq.registry import Registry, Route

__all__ = [
    "AlreadyProcessed", "Envelope", "ErrorCode", "Event", "EventSubject", "Poison", "Registry", "Route",
    "SeamqError", "outbox",
]
