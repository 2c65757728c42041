"""The typed job record and its transitions (seamq.jobs.job), without a server: every move from
every state, the retry rules, the clocks a job needs, and the stored form round-tripping."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from seamq.jobs import job as J
from seamq.jobs import model, tally
from seamq.jobs.model import OjsError, State, parse_time

NOW = parse_time("2026-11-24T12:00:00.000Z")
LEASE = timedelta(seconds=30)


def new(**options) -> J.Job:
    body = {"type": "mail.send", "args": ["ada"], "specversion": "1.0", "meta": {"trace": "t"}, "options": options}
    return J.from_record(model.new_record(body, NOW))


def active(**options) -> J.Job:
    return J.claimed(new(**options), NOW, "w1", LEASE)


@pytest.mark.parametrize("options", [{}, {"queue": "q", "priority": 5}, {"scheduled_at": "2026-11-25T00:00:00Z"},
                                     {"expires_at": "+PT1H", "unique": {"keys": ["type"]}, "tags": ["a"]},
                                     {"retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}, "timeout_ms": 5}])
def test_a_stored_record_round_trips_exactly(options):
    record = model.new_record({"type": "mail.send", "args": [1], "specversion": "1.0", "options": options}, NOW)
    assert J.to_record(J.from_record(record)) == record
    moved = J.to_record(J.claimed(J.from_record(record), NOW, "w", LEASE)) if record["state"] == "available" else record
    assert J.to_record(J.from_record(moved)) == moved and J.from_record(moved).extra == {"specversion": "1.0"}


MOVES = {
    "claimed": (lambda j: J.claimed(j, NOW, "w", LEASE), {J.State.AVAILABLE}),
    "extended": (lambda j: J.extended(j, NOW, LEASE), {J.State.ACTIVE}),
    "completed": (lambda j: J.completed(j, NOW, {"ok": 1}), {J.State.ACTIVE}),
    "failed": (lambda j: J.failed(j, NOW, {"message": "x"}), {J.State.ACTIVE}),
    "released": (lambda j: J.released(j, NOW, {"code": "lease_expired"}), {J.State.ACTIVE}),
    "cancelled": (lambda j: J.cancelled(j, NOW), J.WAITING | {J.State.ACTIVE}),
    "expired": (lambda j: J.expired(j, NOW), J.WAITING),
    "due": (lambda j: J.due(j, NOW), {J.State.SCHEDULED, J.State.RETRYABLE}),
    "retried": (lambda j: J.retried(j, NOW), {J.State.DISCARDED, J.State.CANCELLED}),
    "recounted": (lambda j: J.recounted(J.replace(j, counted_as="available")), set(J.State)),  # wherever it is
}


@pytest.mark.parametrize("move", MOVES)
def test_each_move_starts_only_from_its_states(move):
    do, allowed = MOVES[move]
    for state in J.State:
        job = J.Job(id="j", type="t", queue="q", args=[], state=state, created_at=NOW, attempt=1)
        if state in allowed:
            assert do(job).id == "j"
        else:
            with pytest.raises(OjsError) as refused:
                do(job)
            assert refused.value.status == 409 and state.value in refused.value.message


def test_a_job_read_from_the_store_writes_the_record_written_whole_after_every_move():
    """to_record starts from the record a job was read as and writes the fields that changed: after
    any walk of moves, the record is the one written field by field from nothing."""
    import random

    rng = random.Random(7)
    starts = [model.new_record({"type": "a.b", "args": [1], "specversion": "1.0", "options": options}, NOW)
              for options in ({}, {"scheduled_at": "2026-11-25T00:00:00Z", "tags": ["t"]},
                              {"expires_at": "+PT1H", "retry": {"max_attempts": 2, "on_exhaustion": "dead_letter"}})]
    walks = 0
    for start in starts:
        for _ in range(50):
            job = J.from_record(start)
            for _ in range(6):
                moves = [do for do, allowed in MOVES.values() if job.state in allowed]
                if not moves:  # completed: nothing moves it
                    break
                job = J.from_record(J.to_record(rng.choice(moves)(job))) if rng.random() < 0.5 else \
                    rng.choice(moves)(job)
                whole = J.to_record(dataclasses.replace(job, as_read=None))
                assert J.to_record(job) == whole
                walks += 1
    assert walks > 600


def test_a_result_of_false_or_zero_is_kept():
    for result in (False, 0, "", []):
        assert J.to_record(J.completed(active(), NOW, result))["result"] == result


def test_a_claim_then_an_ack():
    claimed = active()
    assert (claimed.state, claimed.attempt, claimed.worker_id, claimed.lease_until) == (
        J.State.ACTIVE, 1, "w1", NOW + LEASE)
    done = J.completed(claimed, NOW + timedelta(seconds=1), {"sent": True})
    assert done.state == J.State.COMPLETED and done.result == {"sent": True} and done.lease_until is None
    assert J.public(done)["completed_at"] == "2026-11-24T12:00:01.000Z" and "_lease_until" not in J.public(claimed)


@pytest.mark.parametrize("then", ["recounted", "extended", "completed", "failed", "released", "cancelled"])
def test_a_claim_that_counts_later_is_counted_where_it_was_until_its_next_change(then):
    waiting = J.from_record(model.new_record({"type": "mail.send", "args": [], "meta": {"tenant_id": "acme"}}, NOW))
    claimed = J.claimed(waiting, NOW, "w1", LEASE, count_later=True)
    record = J.to_record(claimed)
    assert claimed.state == J.State.ACTIVE and record["_counted"] == "available" and "_counted" not in J.public(claimed)
    assert tally.moves(J.counted(waiting), record) == [], "the claim moves no count: one plain write"
    assert J.from_record(record).counted_as == "available" and J.counted(J.from_record(record))["state"] == "available"
    after = MOVES[then][0](J.from_record(record))
    assert after.counted_as is None and "_counted" not in J.to_record(after)
    place = tally.place(J.to_record(after))

    def moved(counted_as: str) -> list:
        return [] if place[1] == counted_as else [("default", counted_as, "", -1), ("default", *place[1:], 1),
                                                   ("default/acme", counted_as, "", -1), ("default/acme", *place[1:], 1)]
    assert tally.moves(J.counted(claimed), J.to_record(after)) == moved("available")
    assert tally.moves(J.counted(J.claimed(waiting, NOW, "w1", LEASE)), J.to_record(after)) == moved("active")


@pytest.mark.parametrize("claim_later", [False, True])
def test_an_ack_that_counts_later_is_counted_where_it_was_until_recounted(claim_later):
    waiting = J.from_record(model.new_record({"type": "mail.send", "args": []}, NOW))
    claimed = J.claimed(waiting, NOW, "w1", LEASE, count_later=claim_later)
    was = "available" if claim_later else "active"
    done = J.completed(claimed, NOW, {"ok": 1}, count_later=True)
    record = J.to_record(done)
    assert done.state == J.State.COMPLETED and record["_counted"] == was and "_counted" not in J.public(done)
    assert tally.moves(J.counted(claimed), record) == [], "the ack moves no count: one plain write"
    recounted = J.recounted(J.from_record(record))
    assert "_counted" not in J.to_record(recounted)
    assert tally.moves(J.counted(done), J.to_record(recounted)) == [
        ("default", was, "", -1), ("default", "completed", "2026112412", 1)]
    with pytest.raises(model.OjsError) as refused:
        J.recounted(recounted)  # counted where it is: nothing to recount
    assert refused.value.status == 409


def test_a_marked_ack_counts_where_it_was_until_its_processs_marks_record_covers_its_number():
    waiting = J.from_record(model.new_record({"type": "mail.send", "args": [], "meta": {"tenant_id": "acme"}}, NOW))
    claimed = J.claimed(waiting, NOW, "w1", LEASE)
    done = J.marked(J.completed(claimed, NOW, None, count_later=True), ["e1", 5])
    record = J.to_record(done)
    assert record["_mark"] == ["e1", 5] and "_mark" not in J.public(done)
    assert J.from_record(record).mark == ["e1", 5] and J.replace(J.from_record(record)).mark is None
    assert tally.moves(J.counted(claimed), record) == [], "the ack moves no count: one plain write"
    where = {"none read": None, "another process's": {"e2": tally.marks_record("e2", 9, [])},
             "not yet": {"e1": tally.marks_record("e1", 4, [])}, "taken": {"e1": tally.marks_record("e1", 9, [5])},
             "counted": {"e1": tally.marks_record("e1", 5, [3])}}
    assert {name: tally.place(record, marks)[1] for name, marks in where.items()} == {
        "none read": "active", "another process's": "active", "not yet": "active", "taken": "active",
        "counted": "completed"}
    assert tally.counting(record) == tally.moves(J.counted(J.completed(claimed, NOW, None, count_later=True)),
                                                 J.to_record(J.completed(claimed, NOW, None))) == [
        ("default", "active", "", -1), ("default", "completed", "2026112412", 1),
        ("default/acme", "active", "", -1), ("default/acme", "completed", "2026112412", 1)]
    assert J.counted(done)["_mark"] == ["e1", 5], "a change of it says the mark it replaces"
    assert tally.moves(J.counted(done), None, where["counted"]) == [
        ("default", "completed", "2026112412", -1), ("default/acme", "completed", "2026112412", -1)]
    assert tally.moves(J.counted(done), None, where["not yet"]) == [
        ("default", "active", "", -1), ("default/acme", "active", "", -1)]
    with pytest.raises(model.OjsError):
        J.marked(claimed, ["e1", 6])  # only an ack that counts later bears a mark


def test_a_finished_record_is_kept_until_its_hour_leaves_retention_and_a_marks_record_a_day_past_that():
    done = J.to_record(J.marked(J.completed(active(), NOW, None, count_later=True), ["e1", 1]))
    kept = tally.ttl("j1", done, NOW)
    assert tally.RETENTION.total_seconds() < kept <= (tally.RETENTION + timedelta(hours=1)).total_seconds()
    assert tally.ttl(tally.marks_key("e1"), tally.marks_record("e1", 1, []), NOW) == (
        tally.RETENTION + timedelta(days=1)).total_seconds()
    assert tally.ttl("dlq.j1", {"id": "j1"}, NOW) == tally.RETENTION.total_seconds()


@pytest.mark.parametrize("state", ["scheduled", "retryable"])
def test_a_job_come_due_that_counts_later_stays_counted_where_it_waited_through_a_claim_and_an_ack(state):
    waiting = J.replace(J.from_record(model.new_record({"type": "mail.send", "args": []}, NOW)), state=J.State(state))
    due = J.due(waiting, NOW, count_later=True)
    assert due.state == J.State.AVAILABLE and J.to_record(due)["_counted"] == state
    assert tally.moves(J.counted(waiting), J.to_record(due)) == [], "coming due moves no count: one plain write"
    claimed = J.claimed(due, NOW, "w1", LEASE, count_later=True)
    assert claimed.counted_as == state, "a claim that counts later keeps it where it is counted, not available"
    done = J.completed(claimed, NOW, None, count_later=True)
    assert tally.moves(J.counted(done), J.to_record(J.recounted(done))) == [
        ("default", state, "", -1), ("default", "completed", "2026112412", 1)]
    assert tally.moves(J.counted(due), J.to_record(J.claimed(due, NOW, "w1", LEASE))) == [
        ("default", state, "", -1), ("default", "active", "", 1)], "a claim counted at once moves it from there"
    assert J.due(waiting, NOW).counted_as is None


def test_a_workflow_steps_ack_is_counted_at_once():
    step = J.replace(active(), workflow_id="wf1", workflow_index=0)
    assert J.completed(step, NOW, None, count_later=True).counted_as is None


def test_failures_retry_by_the_policy_then_discard_and_keep_every_attempt():
    retry = {"max_attempts": 2, "initial_interval": "PT2S", "jitter": False, "non_retryable_errors": ["Fatal"]}
    first = J.failed(active(retry=retry), NOW, {"type": "Timeout", "message": "slow"})
    assert first.state == J.State.RETRYABLE and first.retry_delay_ms == 2000
    assert first.next_attempt_at == NOW + timedelta(seconds=2) and first.worker_id is None
    second = J.claimed(J.due(first, NOW + timedelta(seconds=2)), NOW, "w2", LEASE)
    last = J.failed(second, NOW, {"type": "Timeout", "message": "slow again"})
    assert last.state == J.State.DISCARDED and not last.dead_letter
    assert [(e["attempt"], e["message"]) for e in last.errors] == [(1, "slow"), (2, "slow again")]
    hopeless = J.failed(active(retry=retry), NOW, {"type": "Fatal", "message": "no"})
    assert hopeless.state == J.State.DISCARDED and hopeless.attempt == 1
    dead = J.failed(active(retry={"max_attempts": 1, "on_exhaustion": "dead_letter"}), NOW, "boom")
    assert dead.dead_letter and J.to_record(dead)["_dlq"] is True
    again = J.retried(dead, NOW)
    assert (again.state, again.attempt, again.dead_letter, len(again.errors)) == (J.State.AVAILABLE, 0, False, 1)


def test_a_release_puts_it_back_with_the_attempt_in_its_history():
    back = J.released(active(), NOW, {"code": "lease_expired", "type": "LeaseExpired", "message": "gone"})
    assert back.state == J.State.AVAILABLE and back.attempt == 1 and back.enqueued_at == NOW
    assert [(e["code"], e["attempt"]) for e in back.errors] == [("lease_expired", 1)]


def test_each_state_needs_its_clocks():
    scheduled = new(scheduled_at="2026-11-25T00:00:00Z", expires_at="2026-11-26T00:00:00Z")
    assert [(t.kind, t.at) for t in J.timers(scheduled)] == [
        ("run", parse_time("2026-11-25T00:00:00Z")), ("expire", parse_time("2026-11-26T00:00:00Z"))]
    running = active(timeout_ms=1500)
    assert [(t.kind, t.at, t.attempt) for t in J.timers(running)] == [
        ("lease", NOW + LEASE, 1), ("timeout", NOW + timedelta(milliseconds=1500), 1)]
    retrying = J.failed(active(retry={"initial_interval": "PT1S", "jitter": False}), NOW, "x")
    assert [t.kind for t in J.timers(retrying)] == ["run"]
    done = J.completed(active(), NOW, None)
    assert [(t.kind, t.at) for t in J.timers(done)] == [("forget", NOW + J.RECORD_TTL)]
    assert J.timers(new()) == []


def test_each_change_leaves_what_its_old_state_held_and_its_new_one_does_not():
    held = J.claimed(new(), NOW, "w1", LEASE, entry="e", hold="h1")
    waiting = new(scheduled_at="2026-11-25T00:00:00Z")
    retrying = J.failed(active(retry={"initial_interval": "PT1S", "jitter": False}), NOW, "x")
    A = J.Aftermath
    assert J.aftermath(new(), held) == A(event="job.started")  # claimed: its hold begins, nothing ends
    assert J.aftermath(held, J.extended(held, NOW, LEASE)) == A()  # a heartbeat keeps its hold
    assert J.aftermath(held, J.completed(held, NOW, None)) == A(settle="h1", finished=True, release=True, event="job.completed")
    assert J.aftermath(held, J.failed(held, NOW, "x")) == A(settle="h1", release=True, event="job.retrying")  # not finished
    assert J.aftermath(held, J.released(held, NOW, "x")) == A(settle="h1", release=True)  # back in its queue, told as nothing
    assert J.aftermath(new(), J.cancelled(new(), NOW)) == A(withdraw=True, finished=True, event="job.cancelled")
    assert J.aftermath(waiting, J.cancelled(waiting, NOW)) == A(disarm="scheduled", finished=True, event="job.cancelled")
    assert J.aftermath(retrying, J.cancelled(retrying, NOW)) == A(disarm="retry", finished=True, event="job.cancelled")
    assert J.aftermath(waiting, J.due(waiting, NOW)) == A()  # its timer fired: the timer is gone already
    assert J.aftermath(waiting, J.expired(waiting, NOW)) == A(disarm="scheduled", finished=True, event="job.expired")
    later = datetime(2026, 11, 25, tzinfo=timezone.utc)
    assert J.aftermath(new(), J.deferred(new(), later)) == A()  # held back by its rate limit key: a run timer, armed first
    assert J.deferred(new(), later).scheduled_at == later and J.deferred(new(), later).state == State.SCHEDULED
    dropped = J.dropped(new(), NOW, {"code": "rate_limited", "message": "full"})
    assert (dropped.state, dropped.error["code"], len(dropped.errors)) == (State.DISCARDED, "rate_limited", 1)
    assert J.aftermath(new(), dropped) == A(withdraw=True, finished=True, event="job.discarded")


def test_an_end_names_its_dead_letter_its_workflow_and_a_claim_after_a_lost_lease_starts_again():
    A = J.Aftermath
    hopeless = active(retry={"max_attempts": 1, "on_exhaustion": "dead_letter"})
    assert J.aftermath(hopeless, J.failed(hopeless, NOW, "x")) == A(finished=True, dead_letter=True, release=True, event="job.discarded")
    plain = active(retry={"max_attempts": 1})
    assert J.aftermath(plain, J.failed(plain, NOW, "x")) == A(finished=True, release=True, event="job.discarded")
    step = J.replace(active(), workflow_id="wf1", workflow_index=0)
    assert J.aftermath(step, J.completed(step, NOW, 1)) == A(finished=True, workflow=True, release=True, event="job.completed")
    assert J.aftermath(step, J.failed(step, NOW, "x")).workflow is False  # retried: the workflow waits
    lost = J.claimed(J.released(active(), NOW, "lease"), NOW, "w2", LEASE)
    assert J.aftermath(active(), lost).event == "job.started"  # the same state, a new attempt
    assert J.aftermath(active(), lost).release is False  # its rate limit permit is the new attempt's


def test_replace_changes_only_what_it_is_given_and_refuses_a_field_a_job_has_not():
    job = J.from_record(model.new_record({"type": "a.b", "args": [1], "options": {"queue": "q"}}, NOW))
    moved = J.replace(job, state=J.State.ACTIVE, attempt=2)
    assert moved == dataclasses.replace(job, state=J.State.ACTIVE, attempt=2) and job.state == J.State.AVAILABLE
    with pytest.raises(TypeError):
        J.replace(job, stat=J.State.ACTIVE)
