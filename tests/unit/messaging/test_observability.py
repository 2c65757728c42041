"""The consumer's direct reading of trace context: the same context as OpenTelemetry's, or the test fails."""

from __future__ import annotations

import random

from opentelemetry import baggage, propagate, trace

from seamq.observability import remote_context

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _seen(ctx):
    return trace.get_current_span(ctx).get_span_context(), dict(baggage.get_all(ctx))


def test_remote_context_reads_as_the_propagators_do_on_hostile_input():
    cases = [
        {}, {"traceparent": VALID}, {"traceparent": VALID[:-2] + "00"}, {"traceparent": VALID[:-2] + "ff"},
        {"traceparent": VALID.upper()}, {"traceparent": " " + VALID}, {"traceparent": VALID + "-extra"},
        {"traceparent": "01" + VALID[2:] + "-future"}, {"traceparent": "ff" + VALID[2:]},
        {"traceparent": "00-" + "0" * 32 + VALID[35:]}, {"traceparent": VALID[:36] + "0" * 16 + VALID[52:]},
        {"traceparent": "00-0x" + VALID[5:]}, {"traceparent": VALID.replace("-", "_")},
        {"traceparent": VALID, "tracestate": "k=v,x=y"}, {"traceparent": VALID, "baggage": "user=alice"},
        {"traceparent": ""}, {"traceparent": "\x00" * 55},
    ]
    rng = random.Random(11)
    alphabet = "0123456789abcdefABX-_ x"
    for _ in range(3000):
        chars = list(VALID)
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(len(chars))] = rng.choice(alphabet)
        cases.append({"traceparent": "".join(chars)})
    for headers in cases:
        assert _seen(remote_context(headers)) == _seen(propagate.extract(headers)), headers
    assert trace.get_current_span(remote_context({"traceparent": VALID})).get_span_context().is_valid


def test_remote_context_defers_to_configured_propagators():
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.baggage.propagation import W3CBaggagePropagator

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([W3CBaggagePropagator()]))  # no trace context read
    try:
        assert not trace.get_current_span(remote_context({"traceparent": VALID})).get_span_context().is_valid
    finally:
        propagate.set_global_textmap(before)
    assert trace.get_current_span(remote_context({"traceparent": VALID})).get_span_context().is_valid


def test_a_traceparent_is_passed_on_to_a_handler_only_in_w3c_shape_and_current_only_for_code_here():
    """It came with the message: one with a line break or any other shape must not reach a request's head."""
    from seamq.observability import continue_trace

    for here in (True, False):
        for given, passed in ((VALID, VALID), (VALID + "\r\nX-Evil: 1", None), ("zz" + VALID[2:], None),
                              ("00-" + "é" * 32 + VALID[35:], None), (None, None)):
            with continue_trace("s.event.e.v1", {} if given is None else {"traceparent": given}, here=here) as out:
                assert out == passed, (given, here)
                current = trace.get_current_span().get_span_context()
                assert current.is_valid == (here and passed is not None), (given, here)
