"""The console's pages for messages: the overview, dead letters (list, groups, one message, replay,
purge, edit and replay), the record of actions, and what the audit found. What each action may do is seamq.dlq_desk's."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone

from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from seamq.console.app import Console, Ctx, Refused
from seamq.console.overview import Overview, sparkline
from seamq.dlq_desk import DeadLetterDesk
from seamq.dead_letter import DeadLetterRow, DlqFilter
from seamq.model import ErrorCode, SeamqError
from seamq.ports import AuditStore

SHOWN = 500  # dead letters a list shows (and a bulk action may take) at once; the count says how many match
FILTERS = ("consumer", "reason", "event_type", "text", "since", "until", "cause")


def key(row: DeadLetterRow) -> str:
    return f"{row.consumer}:{row.message_id}"


def _time(ctx: Ctx, name: str) -> datetime | None:
    value = ctx.one(name).strip()
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)  # the console's times are UTC
    except ValueError:
        raise SeamqError(ErrorCode.INVALID_INPUT, f"{name}: {value[:40]!r} is not a time (2026-11-26T08:00)") from None


def selection(ctx: Ctx, limit: int = SHOWN) -> DlqFilter:
    text = {name: ctx.one(name).strip() or None for name in ("consumer", "reason", "event_type", "text", "cause")}
    return DlqFilter(**text, since=_time(ctx, "since"), until=_time(ctx, "until"), limit=limit)


def keys_of(ctx: Ctx) -> list[tuple[str, uuid.UUID]]:
    out = []
    for value in ctx.many("key"):
        consumer, _, message_id = value.partition(":")
        try:
            out.append((consumer, uuid.UUID(message_id)))
        except ValueError:
            raise SeamqError(ErrorCode.INVALID_INPUT, f"{value[:80]!r} is not consumer:message-id") from None
    if not out:
        raise SeamqError(ErrorCode.INVALID_INPUT, "no dead letter was selected")
    return out


async def rows_of(desk: DeadLetterDesk, keys: list[tuple[str, uuid.UUID]]) -> list[DeadLetterRow]:
    """Exactly the dead letters named, still open; the others are left out (and counted by the caller)."""
    wanted = set(keys)
    ids = sorted({m for _, m in keys})  # each may be a dead letter of several consumers
    rows = await desk.select(DlqFilter(ids=ids, limit=len(ids) * max(1, len(desk.topology.consumers))))
    return [row for row in rows if row.key in wanted]


def routes(console: Console, desk: DeadLetterDesk, overview: Overview, audits: AuditStore) -> list[Route]:
    async def home(ctx: Ctx) -> Response:
        return console.render("overview.html", ctx, **await _overview(overview))

    async def live(ctx: Ctx) -> Response:
        return console.render("overview_live.html", ctx, **await _overview(overview))

    async def dead_letters(ctx: Ctx) -> Response:
        chosen = selection(ctx)
        rows = await desk.select(chosen)
        groups = await desk.groups(replace(chosen, cause=None))
        total = rows[0].total if rows else 0
        return console.render("dead_letters.html", ctx, rows=rows, groups=groups, total=total, key=key,
                              filters={name: ctx.one(name) for name in FILTERS})

    async def message(ctx: Ctx) -> Response:
        consumer, message_id = ctx.request.path_params["consumer"], ctx.request.path_params["message_id"]
        rows = await desk.select(DlqFilter(ids=[_uuid(message_id)], consumer=consumer, purged=True, limit=5))
        if not rows:
            raise SeamqError(ErrorCode.NOT_FOUND, f"no dead letter {message_id} of consumer {consumer}")
        row = (await desk.detail(rows))[0]
        copy = row.dlq_copy or {}
        body = copy.get("original_payload")
        try:
            body = json.dumps(json.loads(body), indent=2, ensure_ascii=False) if isinstance(body, str) else body
        except ValueError:
            pass  # shown as it is: it was not JSON (that may be why it is here)
        return console.render("message.html", ctx, row=row, copy=copy, body=body, key=key(row), state=row.state)

    async def confirm(ctx: Ctx) -> Response:
        action = _action(ctx)
        if ctx.one("cause"):  # a whole group: the set shown here is the set acted on
            rows = await desk.select(DlqFilter(cause=ctx.one("cause"), limit=SHOWN))
        else:
            rows = await rows_of(desk, keys_of(ctx))
        if not rows:
            raise SeamqError(ErrorCode.NOT_FOUND, "none of the selected dead letters is open any more")
        return console.render("confirm.html", ctx, action=action, rows=rows, key=key,
                              more=max(0, rows[0].total - len(rows)))

    async def act(ctx: Ctx) -> Response:
        action, keys = _action(ctx), keys_of(ctx)
        rows = await rows_of(desk, keys)
        done = await (desk.replay if action == "replay" else desk.purge)(rows, ctx.actor)
        return RedirectResponse(f"/actions?done={done.action_id}&gone={len(keys) - len(rows)}", 303)

    async def edit(ctx: Ctx) -> Response:
        consumer, message_id = ctx.request.path_params["consumer"], _uuid(ctx.request.path_params["message_id"])
        rows = await rows_of(desk, [(consumer, message_id)])
        if not rows:
            raise SeamqError(ErrorCode.NOT_FOUND, f"dead letter {message_id} of {consumer} is not open")
        if ctx.request.method == "GET":
            raise Refused(405, "edit from the message's page")
        new_id = await desk.edit_and_replay(rows[0], ctx.one("body").encode(), ctx.actor)
        return RedirectResponse(f"/dead-letters/{consumer}/{message_id}?edited={new_id}", 303)

    async def audit(ctx: Ctx) -> Response:
        store = audits
        since = _time(ctx, "since") or datetime.fromtimestamp(0, timezone.utc)
        return console.render("audit.html", ctx, summary=await store.summary(), walks=await store.walks(),
                              findings=await store.latest(since, SHOWN), since=ctx.one("since"))

    async def actions(ctx: Ctx) -> Response:
        return console.render("actions.html", ctx, actions=await desk.actions(200), done=ctx.one("done"),
                              gone=ctx.one("gone"))

    return [
        Route("/", console.page(home)),
        Route("/overview/live", console.page(live)),
        Route("/dead-letters", console.page(dead_letters)),
        Route("/dead-letters/confirm", console.page(confirm, action=True), methods=["POST"]),
        Route("/dead-letters/act", console.page(act, action=True), methods=["POST"]),
        Route("/dead-letters/{consumer}/{message_id}", console.page(message)),
        Route("/dead-letters/{consumer}/{message_id}/edit", console.page(edit, action=True), methods=["POST"]),
        Route("/actions", console.page(actions)),
        Route("/audit", console.page(audit)),
    ]


def _action(ctx: Ctx) -> str:
    action = ctx.one("action")
    if action not in ("replay", "purge"):
        raise SeamqError(ErrorCode.INVALID_INPUT, f"action {action[:40]!r} is not replay or purge")
    return action


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise SeamqError(ErrorCode.NOT_FOUND, f"{value[:80]!r} is not a message id") from None


async def _overview(overview: Overview) -> dict:
    started = time.perf_counter()
    shot = await overview.snapshot()
    charts = {}
    for name, samples in overview.history.items():
        points = list(samples)
        charts[name] = {"handled": sparkline([p[1] for p in points]), "p99": sparkline([p[3] for p in points]),
                        "samples": len(points), "top_handled": max((p[1] or 0 for p in points), default=0),
                        "top_p99": max((p[3] or 0 for p in points), default=0)}
    return dict(shot=shot, charts=charts, took_ms=(time.perf_counter() - started) * 1000)
