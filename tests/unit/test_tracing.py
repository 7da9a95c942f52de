"""The W3C trace context a client sends, as the router checks it before any engine sees it,
and the GenAI attributes of a request's span."""

from __future__ import annotations

import pytest

from llmgw.core.tracing import (
    SpanFacts,
    TraceParent,
    clean_tracestate,
    client_trace_headers,
    operation_of,
    parse_traceparent,
    span_attributes,
    span_name,
)

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (VALID, TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")),
        (f" {VALID} ", TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")),
        # A later version may add fields; a receiver reads the first four (W3C 3.2.4).
        (VALID.replace("00-", "cc-", 1) + "-what-the-future-holds",
         TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")),
        (None, None),
        ("", None),
        (VALID.upper(), None),  # uppercase hex is not the format
        (VALID + "-extra", None),  # version 00 has exactly four fields
        (VALID.replace("00-", "ff-", 1), None),  # version ff is invalid
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", None),
        (VALID + "\r\nx-injected: yes", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\x00", None),
    ],
)  # fmt: skip
def test_a_traceparent_is_taken_only_in_w3c_format(value: str | None, parsed: TraceParent | None) -> None:
    assert parse_traceparent(value) == parsed


def test_a_passed_on_traceparent_is_written_as_version_00() -> None:
    future = VALID.replace("00-", "cc-", 1) + "-more"
    parent = parse_traceparent(future)
    assert parent is not None and parent.header() == VALID and parent.sampled
    assert not TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "00").sampled


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        ("rojo=1 , congo=2", "rojo=1,congo=2"),
        ("tenant@vendor=x", "tenant@vendor=x"),
        (None, None),
        ("", None),
        ("no-equals-sign", None),
        ("UPPER=1", None),
        ("k=v\x01", None),  # a control character
        ("k=v=w", None),  # "=" inside a value
        ("k=ends-in-space ", "k=ends-in-space"),  # the list's own white space is trimmed
        (",".join(f"k{i}=v" for i in range(33)), None),  # over 32 members
        ("k=" + "v" * 600, None),  # over 512 characters
        ("k=v\r\nx-injected: yes", None),
    ],
)
def test_a_tracestate_is_kept_only_within_w3c_bounds(value: str | None, kept: str | None) -> None:
    assert clean_tracestate(value) == kept


def test_a_tracestate_goes_on_only_with_a_valid_traceparent() -> None:
    assert client_trace_headers({"traceparent": VALID, "tracestate": "a=1"}) == (
        ("traceparent", VALID),
        ("tracestate", "a=1"),
    )
    assert client_trace_headers({"traceparent": VALID, "tracestate": "BAD"}) == (("traceparent", VALID),)
    assert client_trace_headers({"traceparent": "garbage", "tracestate": "a=1"}) == ()
    assert client_trace_headers({"tracestate": "a=1"}) == ()


@pytest.mark.parametrize(
    ("path", "operation"),
    [
        ("/v1/chat/completions", "chat"),
        ("/v1/responses", "chat"),
        ("/v1/messages", "chat"),
        ("/v1/completions", "text_completion"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/models", None),
        ("/health", None),
        ("/v1/messages/count_tokens", None),
    ],
)
def test_the_genai_operation_of_each_api(path: str, operation: str | None) -> None:
    assert operation_of(path) == operation


def _facts(**changes: object) -> SpanFacts:
    base: dict[str, object] = dict(
        operation="chat", requested="llama", answered="llama-small", status=200, stream=True,
        usage={"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}},
        time_to_first_token=0.25,
    )  # fmt: skip
    base.update(changes)
    return SpanFacts(**base)  # type: ignore[arg-type]


def test_a_span_carries_the_genai_attributes_of_what_answered() -> None:
    facts = _facts()
    assert span_name(facts) == "chat llama"
    assert span_attributes(facts) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "llama",
        "gen_ai.response.model": "llama-small",
        "gen_ai.request.stream": True,
        "http.response.status_code": 200,
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.usage.cache_read.input_tokens": 8,
        "gen_ai.server.time_to_first_token": 0.25,
    }


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # Anthropic's shape (the Messages API) and the Responses API's.
        ({"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2}, (3, 4, 2)),
        ({"input_tokens": 3, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 1}}, (3, 4, 1)),
        # An engine's usage that is not counts is not written as counts.
        ({"prompt_tokens": "12", "completion_tokens": -1, "prompt_tokens_details": None}, (None, None, None)),
        ({"prompt_tokens": True}, (None, None, None)),
        (None, (None, None, None)),
    ],
)
def test_usage_in_every_api_shape_and_none_that_is_not_counts(
    usage: dict[str, object] | None, expected: tuple[int | None, int | None, int | None]
) -> None:
    attributes = span_attributes(_facts(usage=usage, time_to_first_token=None, requested="", answered=""))
    found = tuple(
        attributes.get(f"gen_ai.usage.{name}")
        for name in ("input_tokens", "output_tokens", "cache_read.input_tokens")
    )
    assert found == expected
    assert "gen_ai.request.model" not in attributes and "gen_ai.server.time_to_first_token" not in attributes
