"""A user's events and handler (tests/integration/messaging/test_testing_kit.py copies it into a project of its own)."""

from seamq import Envelope, EventModel, Poison

class VibeCreatedV1(EventModel, context="vibespro", name="vibe_created", version=1,
                    aggregate_type="vibe", aggregate_key="vibe_id"):
    vibe_id: str
    mood: str | None = None
    score: int = 0

async def on_vibe_created(envelope: Envelope[VibeCreatedV1], tx) -> None:
    if envelope.payload.mood == "angry":
        raise Poison("no angry vibes")
    if envelope.payload.mood == "flaky":
        raise ConnectionError("downstream away")
    await tx.execute("INSERT INTO vibes (id, mood) VALUES (%s, %s)", (envelope.payload.vibe_id, envelope.payload.mood))

# The same shop as an HTTP handler service (seamq.http.server), signed with a shared secret.
from seamq.http.server import handler_app

async def on_vibe_created_http(envelope: Envelope[VibeCreatedV1]) -> None:
    if envelope.payload.mood == "angry":
        raise Poison("no angry vibes")

app = handler_app(on_vibe_created_http, secret="kit-secret")
