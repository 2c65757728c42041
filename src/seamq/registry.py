"""The handler registry: which handler serves each (event type, version).

A Registry is a static list of Routes. A route's handler is either a Python
import path (`package.module:function`, run in-process inside the inbox
transaction) or an HTTP URL (SDS-047 §12). The consumer resolves routes once
at start and never reloads them: a change needs a restart (REQ-060).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from seamq.model import ErrorCode, SeamqError, validate_token


@dataclass(frozen=True)
class Route:
    event_type: str
    version: int
    handler: str | Callable  # "pkg.module:function", "http://host/handle", or the function itself
    timeout: float | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_token(self.event_type, "event type")

    @property
    def is_http(self) -> bool:
        return isinstance(self.handler, str) and self.handler.startswith(("http://", "https://"))


@dataclass(frozen=True)
class Registry:
    routes: tuple[Route, ...] = ()
    default: str | Callable | None = None  # serves events without a route (e.g. one /handle per context)

    def build(self, *, http_client=None, secret: str | None = None, timeout: float = 10.0):
        """Resolve every route now, so a bad import path fails at start, not on the first message."""
        from seamq.handlers import InProcessHandler
        from seamq.http.client import HttpHandler

        def make(target: str | Callable, route_timeout: float | None):
            seconds = route_timeout or timeout
            if callable(target):
                return InProcessHandler(target, timeout_seconds=seconds)
            if target.startswith(("http://", "https://")):
                return HttpHandler(target, client=http_client, secret=secret, timeout=seconds)
            return InProcessHandler(import_object(target), timeout_seconds=seconds)

        table = {(r.event_type, r.version): make(r.handler, r.timeout) for r in self.routes}
        fallback = make(self.default, None) if self.default else None
        return lambda event_type, version: table.get((event_type, version), fallback)


def import_object(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"handler {path!r} must be 'package.module:name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"cannot import handler {path!r}: {exc}") from None


def load_registry(path: str) -> Registry:
    registry = import_object(path)
    if not isinstance(registry, Registry):
        raise SeamqError(ErrorCode.INVALID_CONFIG, f"{path!r} is a {type(registry).__name__}, not a Registry")
    return registry


HandlerLookup = Callable[[str, int], Any]
__all__: Iterable[str] = ["Route", "Registry", "load_registry", "import_object"]
