"""A Python port of the upstream OJS conformance runner (openjobspec/ojs-conformance
`runner/http/runner.go` and `lib/assertions.go` @9b375f1), as specified in
shared/ojs/DESIGN-BRIEF.md, Appendix B.

No official runner or SDK can be installed here, so this port is the independent
check of `seamq jobs serve`. By default it gives the Go runner's verdicts, quirks
included (`ASSERT` steps unevaluated, `raw_body` dropped, `null` counted as
absent). `--strict` also sends `raw_body`, evaluates the `exclusive_claim` and
`equality` assertions the Go runner skips, reads the newer suites' `expect`, `${name}` and
`repeat`, and fails a case with anything it does not understand (tests/helpers/ojs_strict.py).
A path finds a key with dots in it (`$.job.meta.ojs.codec.key_id`: `meta["ojs.codec.key_id"]`)
and reads a field under an absent one as absent; in strict mode an expected `Content-Type`
without parameters is compared with the answer's media type (`text/plain` for Prometheus'
`text/plain; version=0.0.4`).

    python -m tests.helpers.ojs_runner --url URL --suites DIR [--reset-url URL] [--level N]
        [--category C] [--test ID] [--strict] [--report-file F]

It prints a table per level and ends with `N passed, N failed`; exit 0 only when
nothing failed, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

try:  # as the tests import it, or as `python -m tests.helpers.ojs_runner` from the checkout
    from helpers.ojs_strict import assertions, judged, not_understood
except ImportError:
    from tests.helpers.ojs_strict import assertions, judged, not_understood

TEMPLATE = re.compile(r"\{\{steps\.([^.]+)\.response\.body\.([^}]+)\}\}")
CAPTURED = re.compile(r"\{\{([A-Za-z_][\w-]*)\}\}|\$\{([A-Za-z_][\w-]*)\}")  # `{{job_id}}`, `${job_id}`: a step's capture
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
UUIDV7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
CONTENT_TYPE = "application/openjobspec+json"


# ---- cases -----------------------------------------------------------------------------------

@dataclass
class Case:
    path: str  # relative to the suites folder: the key of a result (test ids repeat)
    test_id: str
    level: int
    category: str
    name: str
    data: dict


def load_cases(suites: Path, level: int | None = None, category: str | None = None,
               test: str | None = None) -> list[Case]:
    cases = []
    for file in sorted(suites.rglob("*.json")):
        data = json.loads(file.read_text())
        if "test_id" not in data or "steps" not in data:
            continue
        raw_level = data.get("level", 0)
        lvl = 99 if raw_level == "ext" else int(raw_level)
        case = Case(str(file.relative_to(suites)), data["test_id"], lvl, data.get("category", ""),
                    data.get("name", ""), data)
        if level is not None and case.level != level:
            continue
        if category and case.category != category:
            continue
        if test and test not in (case.test_id, case.path):
            continue
        cases.append(case)
    return sorted(cases, key=lambda c: (c.test_id, c.path))


# ---- Go-style formatting and path resolution ----------------------------------------------------

def go_format(value: Any) -> str:
    """Go's %v for JSON values."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "<nil>"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_format(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_format(v) for v in value) + "]"
    return str(value)


class PathError(Exception):
    pass


def _split(path: str) -> list[str]:
    path = path[2:] if path.startswith("$.") else path[1:] if path.startswith("$") else path
    parts, depth, current = [], 0, ""
    for ch in path:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "." and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current:
        parts.append(current)
    return parts


_BRACKET = re.compile(r"\[([^\]]*)\]")


def resolve_path(path: str, data: Any) -> Any:
    return _resolve(_split(path), data)


def _dotted(parts: list[str], i: int, current: dict) -> tuple[list[str], int] | None:
    """A key with dots in it (the encryption suite's `meta["ojs.codec.key_id"]`, which it spells
    `$.job.meta.ojs.codec.key_id`): the shortest run of parts from `i` that names a key, the parts
    rewritten to hold it as one. Only where no key is named by the part alone."""
    for end in range(i + 1, len(parts)):
        joined = ".".join(parts[i:end + 1])
        key = joined[:joined.index("[")] if "[" in joined else joined
        if key in current:
            return parts[:i] + [joined] + parts[end + 1:], i
    return None


def _resolve(parts: list[str], current: Any) -> Any:
    for i, part in enumerate(parts):
        if current is None:  # under an absent field: absent too (`$exists: false` holds), never an error
            return None
        name = part[:part.index("[")] if "[" in part else part
        if isinstance(current, dict) and name and name not in current and (found := _dotted(parts, i, current)):
            return _resolve(found[0][i:], current)
        if "[" not in part:
            if not isinstance(current, dict):
                raise PathError(f"{part}: not an object")
            current = current.get(part)
            continue
        if name:
            if not isinstance(current, dict):
                raise PathError(f"{name}: not an object")
            current = current.get(name)
        brackets = _BRACKET.findall(part[part.index("["):])
        for j, inner in enumerate(brackets):
            if inner.startswith("?("):
                match = re.match(r"\?\(@\.([^=!<>]+)\s*==\s*['\"]?(.*?)['\"]?\)$", inner)
                if not isinstance(current, list):
                    raise PathError("filter on a non-array")
                key, want = match.group(1).strip(), match.group(2)
                found = next((e for e in current if isinstance(e, dict) and go_format(e.get(key)) == want), None)
                current = found
                if found is None:
                    return None
            elif inner == "*":
                if not isinstance(current, list):
                    raise PathError("[*] on a non-array")
                tail = ["".join(f"[{b}]" for b in brackets[j + 1:])] if brackets[j + 1:] else []
                rest = tail + parts[i + 1:]
                out = []
                for element in current:
                    try:
                        value = _resolve(rest, element) if rest else element
                    except PathError:
                        continue
                    if value is not None:
                        out.append(value)
                return out
            else:
                if not isinstance(current, list):
                    raise PathError(f"[{inner}] on a non-array")
                index = int(inner)
                if index < 0 or index >= len(current):
                    raise PathError(f"index {index} out of range")
                current = current[index]
    return current


# ---- matchers --------------------------------------------------------------------------------

def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def match(matcher: Any, actual: Any) -> tuple[bool, str]:
    ok, why = _match(matcher, actual)
    return ok, "" if ok else f"expected {json.dumps(matcher)}, got {json.dumps(actual)}" + (f" ({why})" if why else "")


def _match(m: Any, a: Any) -> tuple[bool, str]:
    if m is None:
        return a is None, ""
    if isinstance(m, str):
        return _match_string(m, a)
    if isinstance(m, bool):
        return isinstance(a, bool) and a == m, ""
    if isinstance(m, (int, float)):
        n = _number(a)
        if n is None:
            return False, "not a number"
        if float(m).is_integer() and n.is_integer():
            return n == float(m), ""
        return abs(n - float(m)) <= 1e-9, ""
    if isinstance(m, list):
        if not isinstance(a, list) or len(a) != len(m):
            return False, "array length"
        for mi, ai in zip(m, a):
            ok, why = _match(mi, ai)
            if not ok:
                return False, why
        return True, ""
    if isinstance(m, dict):
        return _match_object(m, a)
    return False, "unknown matcher"


def _match_string(m: str, a: Any) -> tuple[bool, str]:
    if m == "any":
        return True, ""
    if m == "absent":
        return a is None, ""
    if m == "exists":
        return a is not None, ""
    if m in ("string:nonempty", "string:non_empty"):
        return isinstance(a, str) and a != "", ""
    if m == "string:uuid":
        return isinstance(a, str) and bool(UUID.match(a)), ""
    if m == "string:uuidv7":
        return isinstance(a, str) and bool(UUIDV7.match(a)), ""
    if m == "string:datetime":
        return isinstance(a, str) and bool(DATETIME.match(a)), ""
    if m == "number:positive":
        return _number(a) is not None and _number(a) > 0, ""
    if m == "number:non_negative":
        return _number(a) is not None and _number(a) >= 0, ""
    if m == "array:nonempty":
        return isinstance(a, list) and len(a) > 0, ""
    if m == "array:empty":
        return isinstance(a, list) and len(a) == 0, ""
    for prefix in ("array:min_length:", "array:min:"):
        if m.startswith(prefix):
            return isinstance(a, list) and len(a) >= int(m[len(prefix):]), ""
    if m.startswith("array:length:"):
        return isinstance(a, list) and len(a) == int(m[len("array:length:"):]), ""
    found = re.fullmatch(r"array:length\((\d+)\)", m)
    if found:
        return isinstance(a, list) and len(a) == int(found.group(1)), ""
    if m.startswith("contains:"):
        return isinstance(a, list) and any(go_format(e) == m[len("contains:"):] for e in a), ""
    if m.startswith("not_contains:"):
        return isinstance(a, list) and not any(go_format(e) == m[len("not_contains:"):] for e in a), ""
    if m.startswith("string:contains:"):
        return isinstance(a, str) and m[len("string:contains:"):] in a, ""
    found = re.fullmatch(r"number:range\(\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*\)", m)
    if found:
        n = _number(a)
        return n is not None and float(found.group(1)) <= n <= float(found.group(2)), ""
    found = re.fullmatch(r"~(-?[\d.]+)", m)
    if found:
        n, want = _number(a), float(found.group(1))
        return n is not None and abs(n - want) <= abs(want) * 0.5, ""
    found = re.fullmatch(r"string:pattern\((.*)\)", m)
    if found:
        return isinstance(a, str) and re.search(found.group(1), a) is not None, ""
    return isinstance(a, str) and a == m, ""


def _match_object(m: dict, a: Any) -> tuple[bool, str]:
    if "$exists" in m:
        if (a is not None) != bool(m["$exists"]):
            return False, "existence"
        if "$type" in m and a is not None:
            return _type_name(a) == m["$type"], "type"
        return True, ""
    if "$type" in m:
        return _type_name(a) == m["$type"], "type"
    if "$match" in m:
        return isinstance(a, str) and re.search(m["$match"], a) is not None, ""
    if "$in" in m:
        return any(_match(alt, a)[0] for alt in m["$in"]), ""
    if "$size" in m:
        if not isinstance(a, list):
            return False, "not an array"
        size = m["$size"]
        if isinstance(size, dict) and "$gte" in size:
            return len(a) >= size["$gte"], ""
        return len(a) == size, ""
    if "$or" in m:
        return any(_match(alt, a)[0] for alt in m["$or"]), ""
    comparisons = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}
    if set(m) & set(comparisons):  # `{"$gte": 1}`: a number, compared (the ext suites use it)
        n = _number(a)
        if n is None:
            return False, "not a number"
        return all(test(float(n), float(m[op])) for op, test in comparisons.items() if op in m), "comparison"
    if "$empty" in m:
        return True, ""  # the Go runner never fails it
    if "range" in m and isinstance(m["range"], dict):
        n = _number(a)
        if n is None:
            return False, "not a number"
        low, high = m["range"].get("min"), m["range"].get("max")
        return (low is None or n >= low) and (high is None or n <= high), ""
    if not isinstance(a, dict):
        return False, "not an object"
    for key, sub in m.items():
        if sub == "absent":
            if a.get(key) is not None:
                return False, f"{key} present"
            continue
        if key not in a:
            return False, f"{key} missing"
        ok, why = _match(sub, a[key])
        if not ok:
            return False, f"{key}: {why}"
    return True, ""


# ---- running ---------------------------------------------------------------------------------

@dataclass
class Response:
    status: int
    headers: dict[str, str]
    text: str
    parsed: dict | None
    duration_ms: float


@dataclass
class Result:
    case: Case
    status: str = "pass"  # pass | fail | error
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _template_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return go_format(value)
    return json.dumps(value, separators=(",", ":"))


def substitute(text: str, responses: dict[str, Response], captured: dict[str, Any] | None = None) -> str:
    if captured:
        text = CAPTURED.sub(lambda m: _template_value(captured[name]) if (name := m.group(1) or m.group(2)) in captured
                            else m.group(0), text)

    def one(found: re.Match) -> str:
        response = responses.get(found.group(1))
        if response is None or response.parsed is None:
            return found.group(0)
        try:
            value = resolve_path(found.group(2), response.parsed)
        except PathError:
            return found.group(0)
        return found.group(0) if value is None else _template_value(value)

    return TEMPLATE.sub(one, text)


class Runner:
    def __init__(self, url: str, *, strict: bool = False, reset_url: str | None = None, timeout: float = 30.0,
                 verbose: bool = False, spread: list[str] = ()) -> None:
        """`spread`: more servers of the same store; each request then goes to the next one in turn,
        so every step of a case may be answered by another server than the step before."""
        self.url, self.strict, self.reset_url, self.verbose = url.rstrip("/"), strict, reset_url, verbose
        self.bases = [self.url, *(u.rstrip("/") for u in spread)]
        self.servers = itertools.cycle(self.bases)
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def run_all(self, cases: list[Case], on_result=None) -> list[Result]:
        results = []
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            for case in cases:
                result = await self.run_case(session, case)
                results.append(result)
                if on_result:
                    on_result(result)
        return results

    async def run_case(self, session: aiohttp.ClientSession, case: Case) -> Result:
        result = Result(case)
        started = time.monotonic()
        self.captured: dict[str, Any] = {}  # one case at a time (run_all)
        # Each server is reset (one empties the store; each forgets what it held of it).
        for reset_url in [self.reset_url.replace(self.url, base, 1) for base in self.bases] if self.reset_url else []:
            async with session.post(reset_url) as response:
                await response.read()
                if response.status >= 400:
                    result.status, result.failures = "error", [f"reset answered {response.status}"]
                    return result
        responses: dict[str, Response] = {}
        data = case.data
        if self.strict:
            refused = not_understood(data)
            steps = [*(data.get("setup") or {}).get("steps", []), *data["steps"]]
            if not refused and not judged(steps):
                refused = ["no assertion the runner could judge"]
            if refused:
                result.status, result.failures = "fail", [f"not understood: {why}" for why in refused]
                return result
        setup = (data.get("setup") or {}).get("steps", [])
        if setup and await self._steps(session, setup, responses, result) is False:
            result.status = "error"
            return result
        await self._steps(session, data["steps"], responses, result)
        if data.get("teardown"):
            await self._steps(session, data["teardown"].get("steps", []), responses, Result(case))
        if result.failures and result.status == "pass":
            result.status = "fail"
        result.seconds = time.monotonic() - started
        return result

    async def _steps(self, session, steps: list[dict], responses: dict[str, Response], result: Result) -> bool:
        ok, i = True, 0
        while i < len(steps):
            group = [steps[i]]
            while steps[i].get("parallel_with") and i + 1 < len(steps) and (
                    steps[i + 1].get("parallel_with") or steps[i + 1].get("id") == steps[i].get("parallel_with")):
                i += 1
                group.append(steps[i])
                if not steps[i].get("parallel_with"):
                    break
            outcomes = await asyncio.gather(*(self._step(session, s, responses) for s in group))
            for step, failures in zip(group, outcomes):
                for failure in failures:
                    ok = False
                    result.failures.append(f"{step.get('id', '?')}: {failure}")
            i += 1
        return ok

    async def _step(self, session, step: dict, responses: dict[str, Response]) -> list[str]:
        if step.get("delay_ms"):
            await asyncio.sleep(step["delay_ms"] / 1000)
        action = step.get("action", "GET")
        if action == "WAIT":  # duration_ms, else delay_ms (already slept above, as the Go runner does first)
            if "duration_ms" in step:
                await asyncio.sleep(step["duration_ms"] / 1000)
            return []
        if action == "ASSERT":
            if self.strict:
                return self._strict_assert(assertions(step), responses)
            try:  # the Go runner sends it as an HTTP request to the base URL and ignores the answer
                async with session.request("ASSERT", self.url) as response:
                    await response.read()
            except aiohttp.ClientError as exc:
                return [f"ASSERT request failed: {exc}"]
            return []
        failures: list[str] = []
        for _ in range(step.get("repeat", 1) if self.strict else 1):  # `repeat`: the same request, each judged
            failures += await self._request(session, step, action, responses)
        return failures

    async def _request(self, session, step: dict, action: str, responses: dict[str, Response]) -> list[str]:
        path = substitute(step.get("path", ""), responses, self.captured)
        if self.strict and (unresolved := CAPTURED.search(path)):
            return [f"{action} {path}: {unresolved.group(0)} was never captured"]
        headers = dict(step.get("headers") or {})
        body: bytes | None = None
        if self.strict and "raw_body" in step:
            body = step["raw_body"].encode() if isinstance(step["raw_body"], str) else json.dumps(
                step["raw_body"]).encode()
        elif step.get("body") is not None:
            body = substitute(json.dumps(step["body"]), responses, self.captured).encode()
        if body is not None and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = CONTENT_TYPE
        started = time.monotonic()
        try:
            async with session.request(action, next(self.servers) + path, data=body, headers=headers) as response:
                text = await response.text()
                status, response_headers = response.status, {k.lower(): v for k, v in response.headers.items()}
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return [f"{action} {path}: {type(exc).__name__}: {exc}"]
        duration = (time.monotonic() - started) * 1000
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            parsed = None
        recorded = Response(status, response_headers, text, parsed, duration)
        if step.get("id"):
            responses[step["id"]] = recorded
        for name, where in {**(step.get("capture") or {}), **(step.get("captures") or {})}.items():
            try:
                value = resolve_path(where, parsed) if parsed is not None else None
            except PathError:
                value = None
            if value is not None:
                self.captured[name] = value
        checks = assertions(step) if self.strict else step.get("assertions") or {}
        failures = check(json.loads(substitute(json.dumps(checks), responses, self.captured)), recorded,
                         strict=self.strict)
        if self.verbose and failures:
            print(f"    {action} {path} -> {status} {text[:300]}", file=sys.stderr)
        return failures

    def _strict_assert(self, assertions: dict, responses: dict[str, Response]) -> list[str]:
        failures = []
        claim = assertions.get("exclusive_claim")
        if claim:
            job_id = substitute(claim.get("job_id", ""), responses)
            fetched = []
            for reference in claim.get("fetches", []):
                value = _reference(reference, responses)
                if value is _UNRESOLVED:
                    failures.append(f"exclusive_claim: unresolved fetch {reference!r}")
                    continue
                fetched.append(value if isinstance(value, list) else None)
            claim = {**claim, "job_id": job_id}
            with_job = sum(1 for f in fetched if f and any(isinstance(j, dict) and j.get("id") == claim["job_id"]
                                                            for j in f))
            empty = sum(1 for f in fetched if f == [])
            if claim.get("exactly_one_has_job") and with_job != 1:
                failures.append(f"exclusive_claim: {with_job} fetches got job {claim['job_id']}")
            if claim.get("exactly_one_empty") and empty != 1:
                failures.append(f"exclusive_claim: {empty} fetches were empty")
        for left, right in (assertions.get("equality") or {}).items():
            a, b = _whole_body(left, responses), _whole_body(right, responses)
            if a is None or b is None or a != b:
                failures.append(f"equality: {left} != {right}")
        return failures


_UNRESOLVED = object()


def _reference(template: str, responses: dict[str, Response]) -> Any:
    """The value one whole `{{steps.X.response.body.path}}` stands for, typed (strict mode)."""
    found = TEMPLATE.fullmatch(template.strip()) if isinstance(template, str) else None
    if not found or found.group(1) not in responses or responses[found.group(1)].parsed is None:
        return _UNRESOLVED
    try:
        return resolve_path(found.group(2), responses[found.group(1)].parsed)
    except PathError:
        return _UNRESOLVED


def _whole_body(reference: str, responses: dict[str, Response]) -> Any:
    found = re.search(r"steps\.([^.]+)\.response\.body", reference)
    if not found or found.group(1) not in responses:
        return None
    return responses[found.group(1)].parsed


def check(assertions: dict, response: Response, *, strict: bool = False) -> list[str]:
    """`strict`: `{"$empty": true}` among `$or`'s alternatives is an empty body (a 204), as the
    suites mean it; the Go runner never matches it."""
    failures = []
    if "status" in assertions:
        want = assertions["status"]
        if isinstance(want, bool):
            failures.append(f"status matcher {want!r} not understood")
        elif isinstance(want, int):
            if response.status != want:
                failures.append(f"status {response.status}, expected {want}")
        elif isinstance(want, str) and want.startswith("one_of:"):
            if str(response.status) not in [s.strip() for s in want[len("one_of:"):].split(",")]:
                failures.append(f"status {response.status}, expected {want}")
        elif isinstance(want, str):
            if not match(want, response.status)[0]:
                failures.append(f"status {response.status}, expected {want}")
        elif isinstance(want, dict) and "$in" in want:
            if response.status not in want["$in"]:
                failures.append(f"status {response.status}, expected one of {want['$in']}")
        else:
            failures.append(f"status matcher {want!r} not understood")
    if "status_in" in assertions and response.status not in assertions["status_in"]:
        failures.append(f"status {response.status}, expected one of {assertions['status_in']}")
    body = assertions.get("body")
    if isinstance(body, dict):
        alternatives = body.get("$or")
        if alternatives is not None:
            if not any(strict and alt == {"$empty": True} and not response.text.strip() or response.parsed is not None
                       and all(_path_ok(path, m, response.parsed)[0] for path, m in alt.items())
                       for alt in alternatives):
                failures.append("none of the $or alternatives matched")
        if response.parsed is not None:
            for path, matcher in body.items():
                if path.startswith("$") and not path.startswith("$."):
                    continue
                ok, why = _path_ok(path, matcher, response.parsed)
                if not ok:
                    failures.append(f"{path}: {why}")
    for path in assertions.get("body_absent") or []:
        try:
            value = resolve_path(path, response.parsed or {})
        except PathError:
            value = None
        if value is not None:
            failures.append(f"{path}: expected absent, got {json.dumps(value)}")
    for name, want in (assertions.get("headers") or {}).items():
        have = response.headers.get(name.lower())
        if isinstance(want, dict) and "$match" in want:
            ok = have is not None and re.search(want["$match"], have) is not None
        elif isinstance(want, dict) and "$eq" in want:
            ok = have == want["$eq"]
        elif strict and isinstance(want, dict) and "$exists" in want:
            ok = (have is not None) == bool(want["$exists"])
        elif strict and name.lower() == "content-type" and isinstance(want, str) and ";" not in want:
            ok = have is not None and have.split(";")[0].strip().lower() == want.lower()  # the media type
        else:
            ok = have == want
        if not ok:
            failures.append(f"header {name}: {have!r}, expected {want!r}")
    timing = assertions.get("timing_ms") or {}
    if "less_than" in timing and not response.duration_ms < timing["less_than"]:
        failures.append(f"took {response.duration_ms:.0f} ms, expected < {timing['less_than']}")
    if "greater_than" in timing and not response.duration_ms > timing["greater_than"]:
        failures.append(f"took {response.duration_ms:.0f} ms, expected > {timing['greater_than']}")
    if "approximate" in timing:
        n = timing["approximate"]
        if abs(response.duration_ms - n) > max(n * 0.5, 100):
            failures.append(f"took {response.duration_ms:.0f} ms, expected ~{n}")
    if "body_contains" in assertions and assertions["body_contains"] not in response.text:
        failures.append(f"body does not contain {assertions['body_contains']!r}")
    return failures


def _path_ok(path: str, matcher: Any, data: dict) -> tuple[bool, str]:
    try:
        value = resolve_path(path, data)
    except PathError as exc:
        return matcher == "absent", str(exc)
    return match(matcher, value)


# ---- output ----------------------------------------------------------------------------------

def report(results: list[Result], out=sys.stdout) -> tuple[int, int]:
    levels: dict[int, list[Result]] = {}
    for r in results:
        levels.setdefault(r.case.level, []).append(r)
    print(f"{'level':<7}{'total':>7}{'passed':>8}{'failed':>8}", file=out)
    conformant = -1
    for level in sorted(levels):
        rs = levels[level]
        passed = sum(r.status == "pass" for r in rs)
        print(f"{level:<7}{len(rs):>7}{passed:>8}{len(rs) - passed:>8}", file=out)
        if passed == len(rs) and level == conformant + 1:
            conformant = level
    for r in results:
        if r.status != "pass":
            print(f"\n{r.status.upper()} {r.case.test_id} {r.case.path}", file=out)
            for failure in r.failures[:20]:
                print(f"  {failure}", file=out)
    passed = sum(r.status == "pass" for r in results)
    print(f"\nconformant level: {conformant if conformant >= 0 else 'none'}", file=out)
    print(f"{passed} passed, {len(results) - passed} failed", file=out)
    return passed, len(results) - passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OJS conformance runner (a port of the Go runner)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--suites", required=True, type=Path)
    parser.add_argument("--reset-url")
    parser.add_argument("--level", type=int)
    parser.add_argument("--category")
    parser.add_argument("--test")
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--report-file", type=Path)
    args = parser.parse_args(argv)
    if not args.suites.is_dir():
        print(f"error: no suites folder at {args.suites}", file=sys.stderr)
        return 2
    cases = load_cases(args.suites, args.level, args.category, args.test)
    if not cases:
        print("error: no case matches the filters", file=sys.stderr)
        return 2
    runner = Runner(args.url, strict=args.strict, reset_url=args.reset_url, timeout=args.timeout,
                    verbose=args.verbose)
    results = asyncio.run(runner.run_all(cases))
    passed, failed = report(results)
    if args.report_file:
        args.report_file.write_text(json.dumps([
            {"test_id": r.case.test_id, "path": r.case.path, "level": r.case.level, "status": r.status,
             "failures": r.failures, "seconds": round(r.seconds, 3)} for r in results], indent=2))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
