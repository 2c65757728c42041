"""What the OJS runner understands in `--strict` mode, and the newer suites' `expect` read as the
assertions it checks (tests/helpers/ojs_runner.py).

The Go runner skips whatever it does not know: a step's `expect` (the extension suites written
after it), an unknown matcher, a `status_one_of`. A case made only of such things "passes" with
nothing judged: ext-durable-execution passed 22 of 22 against a server with no checkpoint route
(issue 49). In strict mode a case with a key, action, assertion or matcher the runner does not
know fails before it sends anything, naming it, and a case in which nothing could be judged fails.
"""

from __future__ import annotations

import re
from typing import Any

CASE_KEYS = {"test_id", "level", "category", "name", "description", "spec_ref", "tags", "steps", "setup", "teardown"}
STEP_KEYS = {"id", "description", "intent", "action", "path", "headers", "body", "raw_body", "assertions", "expect",
             "capture", "captures", "delay_ms", "duration_ms", "parallel_with", "repeat"}
ACTIONS = {"GET", "POST", "PUT", "PATCH", "DELETE", "ASSERT", "WAIT"}
CHECKS = {"status", "status_in", "status_one_of", "body", "body_absent", "body_contains", "headers", "timing_ms"}
ASSERT_CHECKS = {"exclusive_claim", "equality"}  # an ASSERT step's, over earlier answers
OPERATORS = {"$exists", "$type", "$match", "$in", "$size", "$or", "$gt", "$gte", "$lt", "$lte", "$empty", "$eq"}
TYPES = {"string", "number", "boolean", "array", "object", "null"}
# The string matchers of lib/assertions.go that take a form; any other string is a literal.
STRING_FORMS = re.compile(r"(array|number|string):.*|~-?[\d.]+|contains:.*|not_contains:.*")
KNOWN_STRINGS = re.compile(
    r"string:(nonempty|non_empty|uuid|uuidv7|datetime|contains:.*|pattern\(.*\))|number:(positive|non_negative|"
    r"range\(\s*-?[\d.]+\s*,\s*-?[\d.]+\s*\))|array:(nonempty|empty|min_length:\d+|min:\d+|length:\d+|length\(\d+\))|"
    r"~-?[\d.]+|contains:.*|not_contains:.*")
CAPTURE_PATH = re.compile(r"\$(\.[A-Za-z_][\w-]*|\[\d+\])+")
# The one form of `preconditions` the suites use (ext-backpressure): read, and held to the case's first step.
QUEUE_BOUND = re.compile(r"Queue '([^']+)' must have max_depth=(\d+)(?: and warning_threshold=([\d.]+))? configured"
                         r"(?: via admin API)?")


def not_understood(data: dict) -> list[str]:
    """Everything in a case that strict mode would not judge; empty when it can run it whole."""
    found = [f"case key {key!r}" for key in data if key not in CASE_KEYS and not (key == "preconditions"
                                                                                and established(data))]
    steps = [*((data.get("setup") or {}).get("steps") or []), *data.get("steps", []),
             *((data.get("teardown") or {}).get("steps") or [])]
    for step in steps:
        where = f"step {step.get('id', '?')}"
        found += [f"{where}: key {key!r}" for key in step if key not in STEP_KEYS]
        action = step.get("action", "GET")
        if action not in ACTIONS:
            found.append(f"{where}: action {action!r}")
        allowed = ASSERT_CHECKS if action == "ASSERT" else CHECKS
        found += [f"{where}: assertion {key!r}" for key in step.get("assertions") or {}
                  if key not in allowed and not key.endswith("_comment")]
        for key in step.get("expect") or {}:
            if not (key in CHECKS or key.startswith(("body.", "headers.")) or key.endswith("_comment")):
                found.append(f"{where}: expect {key!r}")
        for name, path in {**(step.get("capture") or {}), **(step.get("captures") or {})}.items():
            if not (isinstance(path, str) and CAPTURE_PATH.fullmatch(path)):
                found.append(f"{where}: capture {name!r} from {path!r}")
        if not isinstance(step.get("repeat", 1), int) or step.get("repeat", 1) < 1:
            found.append(f"{where}: repeat {step['repeat']!r}")
        if action != "ASSERT":
            found += [f"{where}: {why}" for why in _matchers(assertions(step))]
    return found


def established(data: dict) -> bool:
    """Whether the case's first step makes its precondition true: `Queue 'q' must have max_depth=N
    [and warning_threshold=x] configured`, by a PUT of exactly that bound to the queue's config."""
    found = QUEUE_BOUND.fullmatch(str(data.get("preconditions", "")).strip())
    first = (data.get("steps") or [{}])[0]
    if found is None or first.get("action") != "PUT" or first.get("path") != f"/ojs/v1/admin/queues/{found[1]}/config":
        return False
    bound = (first.get("body") or {}).get("backpressure") or {}
    return bound.get("max_depth") == int(found[2]) and (found[3] is None or bound.get("warning_threshold") == float(found[3]))


def assertions(step: dict) -> dict:
    """A step's checks: its `assertions` and its `expect` (`"body.a.b": m` is the body's `$.a.b`,
    `"headers.X": v` a header), without the comments that explain them."""
    out: dict[str, Any] = {k: v for k, v in (step.get("assertions") or {}).items() if not k.endswith("_comment")}
    for key, want in (step.get("expect") or {}).items():
        if key.endswith("_comment"):
            continue
        if key.startswith("body."):
            out["body"] = {**(out.get("body") or {}), "$." + key[len("body."):]: want}
        elif key.startswith("headers."):
            out["headers"] = {**(out.get("headers") or {}), key[len("headers."):]: want}
        elif key in ("body", "headers") and isinstance(want, dict):
            out[key] = {**(out.get(key) or {}), **want}
        else:
            out[key] = want
    if "status_one_of" in out:  # the same check under its other name
        out["status_in"] = [*out.get("status_in", []), *out.pop("status_one_of")]
    return out


def judged(steps: list[dict]) -> int:
    """How many checks a case's steps make (an ASSERT step's included)."""
    return sum(len(assertions(step)) for step in steps)


def _matchers(checks: dict) -> list[str]:
    found = []
    status = checks.get("status")
    if "status" in checks and not (isinstance(status, int) and not isinstance(status, bool)
                                   or isinstance(status, str) or isinstance(status, dict) and set(status) == {"$in"}):
        found.append(f"status matcher {status!r}")
    body = checks.get("body")
    if "body" in checks and not isinstance(body, dict):
        found.append(f"body matcher {body!r}")
    for path, matcher in (body or {}).items() if isinstance(body, dict) else ():
        if path == "$or":
            if not isinstance(matcher, list) or not all(isinstance(alt, dict) for alt in matcher):
                found.append(f"$or {matcher!r}")
                continue
            found += [f"$or path {key!r}" for alt in matcher for key in alt
                      if not (key.startswith("$.") or alt == {"$empty": True})]
            found += [why for alt in matcher for m in alt.values() for why in _matcher(m)]
        elif path.startswith("$") and not path.startswith("$."):
            found.append(f"body path {path!r}")
        else:
            found += [f"{path}: {why}" for why in _matcher(matcher)]
    for name, want in (checks.get("headers") or {}).items():
        if isinstance(want, dict) and not (set(want) <= {"$match", "$eq", "$exists"} and len(want) == 1):
            found.append(f"header {name}: matcher {want!r}")
    return found


def _matcher(m: Any) -> list[str]:
    if isinstance(m, str):
        return [f"matcher {m!r}"] if STRING_FORMS.fullmatch(m) and not KNOWN_STRINGS.fullmatch(m) else []
    if isinstance(m, list):
        return [why for each in m for why in _matcher(each)]
    if not isinstance(m, dict):
        return []
    operators = {key for key in m if key.startswith("$")}
    if not operators:  # an object matched field by field
        return [why for sub in m.values() for why in _matcher(sub)]
    found = [f"operator {key!r}" for key in operators - OPERATORS]
    if "$type" in m and m["$type"] not in TYPES:
        found.append(f"type {m['$type']!r}")
    for key in ("$in", "$or"):
        found += [why for alternative in m.get(key) or () for why in _matcher(alternative)]
    return found
