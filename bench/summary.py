"""Where seamq stands, in one table: its ratio to each peer a user would install instead, and each
stage's CPU against its floor (the bare client doing the same wire work), from the scenarios of
this run. `bench.run` prints it last and writes it first; a scenario not run leaves its lines out."""

from __future__ import annotations

from bench.common import Result
from bench.peers_jobs import NATIVE


def _rows(results: list[Result], scenario: str) -> list[dict]:
    return next((r.rows for r in results if r.scenario == scenario), [])


def _row(rows: list[dict], start: str) -> dict | None:
    return next((row for row in rows if str(row.get("case", "")).startswith(start)), None)


def _line(out: Result, measure: str, ours, theirs, target: str, met: bool | None, ratio: float | None = None) -> None:
    out.add(measure=measure, seamq=ours, against=theirs, ratio="-" if ratio is None else f"{ratio:.2f}",
            target=target, met="-" if met is None else ("yes" if met else "no"))


def summary(results: list[Result]) -> Result:
    out = Result("summary")
    relay = _rows(results, "peers_relay")
    if relay:
        ours, peers = relay[0], relay[1:]
        best = max(peers, key=lambda row: row["events_per_s"])
        ratio = ours["events_per_s"] / best["events_per_s"]
        _line(out, "relay events/s vs the fastest outbox peer", ours["events_per_s"],
              f"{best['events_per_s']} ({best['case']})", ">= 3x", ratio >= 3, ratio)
    latency = _rows(results, "peers_relay_latency")
    if latency:
        ours, peers = latency[0], latency[1:]
        best = min(peers, key=lambda row: row["p99_ms"])
        _line(out, "relay p99 commit -> published at 2k/s (ms)", ours["p99_ms"], f"{best['p99_ms']} ({best['case']})",
              "lower", ours["p99_ms"] < best["p99_ms"])
    history = _rows(results, "relay_history")
    if len(history) == 2:
        empty, full = history
        _line(out, f"relay catch-up with {full['history_rows']:,} rows of history vs an empty outbox (events/s)",
              full["events_per_s"], empty["events_per_s"], ">= 0.8", full["ratio"] >= 0.8, full["ratio"])
    peer = _rows(results, "peer")
    if peer and (ours := _row(peer, "seamq consume, inbox on")):
        _line(out, "consumer msgs/s, inbox on, vs FastStream's pull subscriber", ours["msgs_per_s"],
              peer[0]["msgs_per_s"], ">= 3x", ours["ratio"] >= 3, ours["ratio"])
    jobs = _rows(results, "peers_jobs")
    native = _row(jobs, NATIVE)
    for row in jobs:
        if native and row.get("processed") and not row["case"].startswith("seamq"):
            ratio = native["processed"] / row["processed"]
            _line(out, f"jobs processed/s vs {row['case']} (seamq: `jobs worker --nats`)", native["processed"],
                  row["processed"], "ahead", ratio > 1, ratio)
    http = _rows(results, "http")
    raw, ours = _row(http, "raw aiohttp"), _row(http, "seamq consume")
    if raw and ours:
        cpu = ours["cpu_us_client"] / raw["cpu_us_client"]
        _line(out, "HTTP mode: consumer CPU per message vs a bare aiohttp client's per request (us)",
              ours["cpu_us_client"], raw["cpu_us_client"], "<= 1.5x", cpu <= 1.5, cpu)
        rate = ours["msgs_per_s"] / raw["msgs_per_s"]
        _line(out, "HTTP mode: msgs/s vs the bare aiohttp client", ours["msgs_per_s"], raw["msgs_per_s"], ">= 0.55",
              rate >= 0.55, rate)
    e2e = next((row for row in _rows(results, "e2e") if row.get("offered_per_s") == 2000), None)
    if e2e:
        _line(out, "p99 commit -> handler at 2k events/s (ms)", e2e["p99_ms"], "-", "<= 20", e2e["p99_ms"] <= 20)
    stages = [("relay", "raw pipelined publish", "relay x1", "cpu_us_relay", "relay: CPU per event vs nats-py's bare publisher"),
              ("consumer", "raw fetch + ack", "seamq consume x1", "cpu_us_consumer",
               "consumer (inbox, in-process): CPU per message vs nats-py's bare fetch + ack"),
              ("http", "raw seamq.http.wire", "seamq consume", "cpu_us_client",
               "HTTP mode: consumer CPU per message vs its handler client's bare request (seamq.http.wire)")]
    for scenario, floor_case, our_case, column, label in stages:
        rows = _rows(results, scenario)
        floor, ours = _row(rows, floor_case), _row(rows, our_case)
        if floor and ours and floor.get(column):
            _line(out, label + " (us)", ours[column], floor[column], "-", None, ours[column] / floor[column])
    return out
