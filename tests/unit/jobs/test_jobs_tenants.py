"""Tenants and pools: what a job's tenant is, its counts kept beside its queue's, a fetch for a tenant and
one for all (seamq.jobs.tenants, seamq.jobs.pools), on the in-memory store with two servers."""

from __future__ import annotations


import pytest

from seamq.jobs import pools, tally, tenants
from seamq.jobs.model import STATES, OjsError, check_queue


def test_a_tenant_comes_from_meta_or_the_header_and_the_two_must_agree():
    assert tenants.of({"meta": {"tenant_id": "acme:eu"}}) == "acme:eu"
    assert tenants.of({"meta": {"tenant_id": "_default"}}) == "" and tenants.of({}) == ""
    assert tenants.stamped({"type": "t"}, "acme")["meta"] == {"tenant_id": "acme"}
    assert tenants.stamped({"type": "t", "meta": {"tenant_id": "acme"}}, "acme")["meta"]["tenant_id"] == "acme"
    with pytest.raises(ValueError, match="not the tenant of the X-OJS-Tenant header"):
        tenants.stamped({"type": "t", "meta": {"tenant_id": "beta"}}, "acme")
    with pytest.raises(ValueError):
        tenants.given("no spaces")
    assert tenants.given(None) is None and tenants.given("_default") == ""
    assert tenants.problem({"tenant_id": 5}) and tenants.problem({"tenant_id": "a b"}) and not tenants.problem({})
    name = tenants.tally_queue("mail.out", "beta.io:eu")
    assert tenants.from_tally(name) == ("mail.out", "beta.io:eu") and tenants.from_tally("mail.out") is None
    assert tally.key(name, 3).startswith("tally.mail=out/beta=io_eu.")  # a key NATS takes, no queue's


def test_a_pool_shares_a_fetch_between_its_queues_by_weight_and_turns():
    pool = pools.pool_of("p", {"queues": {"a": {"weight": 3}, "b": {"weight": 1}}, "strategy": "weighted"}, check_queue)
    assert pool.weights == (("a", 3), ("b", 1))
    assert pools.shares(["a", "b"], 8, pool, 0)[:2] == [("a", 6), ("b", 2)]
    assert pools.shares(["a", "b"], 8, pool, 1)[:2] == [("b", 2), ("a", 6)]  # the first served moves on
    even = pools.pool_of("e", {"queues": ["a", "b"]}, check_queue)
    assert even.strategy == "round-robin" and pools.shares(["a", "b"], 1, even, 0)[0] == ("a", 1)
    assert pools.shares(["a", "b"], 1, even, 1)[0] == ("b", 1)
    assert pools.shares(["a", "b"], 4, None, 1) == [("a", 4), ("b", 4)]  # no pool: in the order named
    for bad in ({"queues": []}, {"queues": ["A!"]}, {"queues": ["a"], "strategy": "least-loaded"},
                {"queues": ["a"], "weights": {"b": 1}}, {"queues": ["a"], "weights": {"a": 0}}, {"name": "other", "queues": ["a"]}):
        with pytest.raises((ValueError, OjsError)):
            pools.pool_of("p", bad, check_queue)


async def test_a_fetch_for_a_tenant_gets_its_jobs_alone_and_one_for_all_takes_each_tenant_in_turn(servers):
    one, other = servers
    heavy = [(await one.ops.push({"type": "t.x", "args": [n], "options": {"queue": "mt"}, "meta": {"tenant_id": "big"}}))[1]["id"]
             for n in range(10)]
    light = (await one.ops.push({"type": "t.x", "args": [], "options": {"queue": "mt"}, "meta": {"tenant_id": "small"}}))[1]["id"]
    got = await other.ops.fetch(["mt"], 2, "w")
    assert light in [j["id"] for j in got]  # not behind big's ten
    assert await other.ops.fetch(["mt"], 5, "w", None, "small") == []  # small has no more
    assert [j["id"] for j in await one.ops.fetch(["mt"], 3, "w", None, "big")] == [j for j in heavy if j not in
                                                                                   {g["id"] for g in got}][:3]
    counted = await other.queues.stats("mt", "big")
    assert (counted["active"], counted["available"]) == (4, 6)
    assert (await other.queues.stats("mt", "small"))["active"] == 1
    assert (await other.queues.stats("mt"))["active"] == 5
    tallied = await other.queues.tallied()
    assert other.queues.tenant_names(tallied) == ["big", "small"]
    assert other.queues.tenant_stats("big", tallied) == {"mt": {**dict.fromkeys(STATES, 0), "active": 4, "available": 6}}
    assert "mt" in await other.queues.names(tallied)


async def test_a_pool_makes_a_fetch_of_two_queues_take_from_both(servers):
    one, other = servers
    for queue in ("pa", "pb"):
        for n in range(4):
            await one.ops.push({"type": "t.x", "args": [n], "options": {"queue": queue}})
    assert {j["queue"] for j in await one.ops.fetch(["pa", "pb"], 2, "w")} == {"pa"}  # no pool: in order
    await one.queues.set_pool(pools.pool_of("both", {"queues": ["pa", "pb"]}, check_queue), "both")
    assert {j["queue"] for j in await one.ops.fetch(["pa", "pb"], 2, "w")} == {"pa", "pb"}
