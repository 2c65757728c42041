"""The OJS runner in strict mode judges what the newer suites say (`expect`, `${name}`, `repeat`),
and fails a case it does not understand or in which it could judge nothing, before it sends a
request (issue 49: ext-durable-execution "passed" 22/22 against a server with no checkpoint route).
Planted cases against a small server on 127.0.0.1 that answers as a checkpoint route would."""

from __future__ import annotations

import copy

import pytest
from aiohttp import web

from helpers.ojs_runner import Case, Runner

SAVE_AND_READ = {
    "test_id": "T-1", "level": 0, "category": "planted", "name": "save and read a checkpoint",
    "steps": [
        {"id": "push", "action": "POST", "path": "/ojs/v1/jobs", "body": {"type": "t", "args": []},
         "expect": {"status": 201}, "capture": {"job_id": "$.id"}},
        {"id": "save", "action": "PUT", "path": "/ojs/v1/jobs/${job_id}/checkpoint", "repeat": 2,
         "body": {"state": {"cursor": "page-7"}}, "expect": {"status": 200}},
        {"id": "read", "action": "GET", "path": "/ojs/v1/jobs/${job_id}/checkpoint",
         "expect": {"status": 200, "body.state.cursor": "page-7", "body.saves": 2}},
    ],
}


@pytest.fixture
async def server():
    saved: dict[str, dict] = {}
    seen: list[str] = []

    async def push(request):
        seen.append("push")
        return web.json_response({"id": "job-1"}, status=201)

    async def save(request):
        seen.append(f"save {request.match_info['job_id']}")
        body = await request.json()
        before = saved.get(request.match_info["job_id"], {"saves": 0})
        saved[request.match_info["job_id"]] = {"state": body["state"], "saves": before["saves"] + 1}
        return web.json_response({"ok": True})

    async def read(request):
        seen.append("read")
        found = saved.get(request.match_info["job_id"])
        return web.json_response(found) if found else web.json_response({"error": "none"}, status=404)

    app = web.Application()
    app.add_routes([web.post("/ojs/v1/jobs", push), web.put("/ojs/v1/jobs/{job_id}/checkpoint", save),
                    web.get("/ojs/v1/jobs/{job_id}/checkpoint", read)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", seen, saved
    await runner.cleanup()


async def run(url: str, data: dict, *, strict: bool = True):
    [result] = await Runner(url, strict=strict).run_all([Case("planted.json", data["test_id"], 0, "planted",
                                                              data["name"], data)])
    return result


async def test_expect_captures_and_repeat_are_judged(server):
    url, seen, _ = server
    result = await run(url, SAVE_AND_READ)
    assert (result.status, result.failures) == ("pass", [])
    assert seen == ["push", "save job-1", "save job-1", "read"]


async def test_a_wrong_answer_under_expect_fails_the_case(server):
    url, _, _ = server
    wrong = copy.deepcopy(SAVE_AND_READ)
    wrong["steps"][2]["expect"]["body.state.cursor"] = "page-8"
    result = await run(url, wrong)
    assert result.status == "fail" and any("cursor" in f for f in result.failures), result.failures
    # The Go runner's way, kept as the default: `expect` is not read, and the case passes.
    assert (await run(url, wrong, strict=False)).status == "pass"


async def test_a_name_never_captured_fails_the_step_instead_of_sending_it(server):
    url, seen, _ = server
    uncaptured = copy.deepcopy(SAVE_AND_READ)
    del uncaptured["steps"][0]["capture"]
    result = await run(url, uncaptured)
    assert result.status == "fail" and any("${job_id} was never captured" in f for f in result.failures)
    assert seen == ["push"], "nothing was sent to /jobs/${job_id}/..."


@pytest.mark.parametrize("plant, named", [
    (lambda d: d["steps"][0].update(expects={"status": 201}), "key 'expects'"),
    (lambda d: d["steps"][1].update(action="PATCHY"), "action 'PATCHY'"),
    (lambda d: d["steps"][2]["expect"].update({"body.saves": {"$between": [1, 3]}}), "operator '$between'"),
    (lambda d: d["steps"][2]["expect"].update({"body.saves": "number:even"}), "matcher 'number:even'"),
    (lambda d: d["steps"][2].update(assertions={"status_is": 200}), "assertion 'status_is'"),
    (lambda d: d["steps"][2]["expect"].update({"elapsed": 10}), "expect 'elapsed'"),
    (lambda d: d.update(preconditions="a queue configured by hand"), "case key 'preconditions'"),
    (lambda d: d["steps"][0].update(capture={"job_id": "id"}), "capture 'job_id' from 'id'"),
])
async def test_anything_it_does_not_understand_fails_the_case_before_a_request(server, plant, named):
    url, seen, _ = server
    planted = copy.deepcopy(SAVE_AND_READ)
    plant(planted)
    result = await run(url, planted)
    assert result.status == "fail" and any(named in f for f in result.failures), result.failures
    assert seen == []


async def test_a_case_with_nothing_to_judge_fails(server):
    url, seen, _ = server
    bare = copy.deepcopy(SAVE_AND_READ)
    for step in bare["steps"]:
        step.pop("expect")
    result = await run(url, bare)
    assert result.failures == ["not understood: no assertion the runner could judge"] and seen == []


@pytest.mark.parametrize("want, status", [("k1", "pass"), ("k2", "fail")])
async def test_a_key_with_dots_is_found_by_the_path_that_spells_it(server, want, status):
    """The encryption suite's `$.job.meta.ojs.codec.key_id` names `meta["ojs.codec.key_id"]`."""
    url, _, _ = server
    dotted = copy.deepcopy(SAVE_AND_READ)
    dotted["steps"][1]["body"]["state"] = {"ojs.codec.key_id": "k1", "ojs_encoded": True}
    dotted["steps"][2]["expect"] = {"status": 200, "body.state.ojs.codec.key_id": want}
    assert (await run(url, dotted)).status == status


@pytest.mark.parametrize("exists, status", [(False, "pass"), (True, "fail")])
async def test_a_field_under_an_absent_one_is_absent(server, exists, status):
    url, _, _ = server
    absent = copy.deepcopy(SAVE_AND_READ)
    absent["steps"][2]["expect"] = {"status": 200, "body.meta.ojs_encoded": {"$exists": exists}}
    assert (await run(url, absent)).status == status


@pytest.mark.parametrize("first, held", [
    ({"action": "PUT", "path": "/ojs/v1/admin/queues/q/config", "body": {"backpressure": {"max_depth": 2}}}, True),
    ({"action": "PUT", "path": "/ojs/v1/admin/queues/q/config", "body": {"backpressure": {"max_depth": 3}}}, False),
    ({"action": "PUT", "path": "/ojs/v1/admin/queues/other/config", "body": {"backpressure": {"max_depth": 2}}}, False),
    ({"action": "POST", "path": "/ojs/v1/jobs", "body": {"type": "t", "args": []}}, False),
])
def test_a_precondition_is_understood_only_when_the_case_makes_it_true_first(first, held):
    from helpers.ojs_strict import not_understood

    case = {"test_id": "T", "name": "n", "preconditions": "Queue 'q' must have max_depth=2 configured via admin API",
            "steps": [{"id": "config", **first, "expect": {"status": 200}}]}
    assert ("case key 'preconditions'" not in not_understood(case)) is held
