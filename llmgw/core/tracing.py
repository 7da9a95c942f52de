"""W3C Trace Context as llmgw reads it from clients, and a request's span as data.

Owns: checking a client's ``traceparent`` and ``tracestate`` (W3C Trace Context Level 1,
https://www.w3.org/TR/trace-context/: the header formats, what a receiver does with one it
cannot parse) before any of it goes on to an engine; the OpenTelemetry GenAI attributes of
a request's span (``gen_ai.*``, semantic conventions 1.37, opentelemetry-semantic-conventions
0.66b2's ``gen_ai_attributes``) from what the router saw.

Both headers come from the client, so both are untrusted: a value that is not the format
is dropped (W3C: a vendor "MUST" then start a new trace, and "MUST NOT" pass on a
tracestate without a valid traceparent), and a tracestate is kept only within W3C's own
bounds (32 list members, 512 characters is what a vendor must propagate) and in printable
ASCII, so a header cannot carry more than a trace id to the engines.

Must not: draw span ids (the adapter's tracer does) or read a clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# version "-" trace-id "-" parent-id "-" trace-flags, lowercase hex. Version ff is invalid;
# a later version may append fields after a "-" (W3C 3.2.4 "Versioning of traceparent").
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# key "=" value: a key of lowercase letters, digits and _-*/ (with one @ for a tenant), a value
# of printable ASCII but "," and "=", not ending in a space (W3C 3.3.1.3).
_TRACESTATE_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TRACESTATE_KEY = r"[a-z0-9][a-z0-9_\-*/]{0,240}(?:@[a-z][a-z0-9_\-*/]{0,13})?"
_TRACESTATE_MEMBER = re.compile(_TRACESTATE_KEY + "=" + _TRACESTATE_VALUE)
TRACESTATE_MAX_MEMBERS = 32
TRACESTATE_MAX_LENGTH = 512


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: str  # 32 lowercase hex digits, not all zero
    parent_id: str  # 16 lowercase hex digits, not all zero
    flags: str  # 2 hex digits; 01 is "sampled"

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 1)

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The client's ``traceparent``, or None when it is absent or not W3C's format."""
    if not value:
        return None
    matched = _TRACEPARENT.fullmatch(value.strip())
    if matched is None:
        return None
    version, trace_id, parent_id, flags, rest = matched.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceParent(trace_id, parent_id, flags)


def clean_tracestate(value: str | None) -> str | None:
    """The client's ``tracestate`` with W3C's bounds held, or None when nothing is left."""
    if not value or len(value) > TRACESTATE_MAX_LENGTH:
        return None
    members = [member.strip() for member in value.split(",") if member.strip()]
    if not members or len(members) > TRACESTATE_MAX_MEMBERS:
        return None
    if not all(_TRACESTATE_MEMBER.fullmatch(member) for member in members):
        return None
    return ",".join(members)


def client_trace_headers(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What of the client's trace context may go on to an engine unchanged (when the
    router itself records no span): a valid traceparent, and its tracestate if valid."""
    parent = parse_traceparent(headers.get(TRACEPARENT))
    if parent is None:
        return ()
    state = clean_tracestate(headers.get(TRACESTATE))
    found: tuple[tuple[str, str], ...] = ((TRACEPARENT, parent.header()),)
    return (*found, (TRACESTATE, state)) if state is not None else found


# --- the span of one request -----------------------------------------------------------------

# gen_ai.operation.name by the router's API path (GenAiOperationNameValues): the Responses and
# Messages APIs are chat turns to the engines.
_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "chat",
    "/v1/messages": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}


def operation_of(path: str) -> str | None:
    """The GenAI operation a router path is, or None for a path that is no model call."""
    return _OPERATIONS.get(path)


@dataclass(frozen=True, slots=True)
class SpanFacts:
    """What the router knows of a request when it ends, for its span."""

    operation: str
    requested: str  # the catalog model the request resolved to ("" if none)
    answered: str  # the model that answered ("" if none)
    status: int
    stream: bool
    usage: Mapping[str, object] | None
    time_to_first_token: float | None  # seconds, a stream's


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def cached_tokens(usage: Mapping[str, object]) -> int | None:
    """Cached prompt tokens as OpenAI's usage (``prompt_tokens_details.cached_tokens``, which
    vLLM and SGLang report) or Anthropic's (``cache_read_input_tokens``) carries them."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        found = _count(details.get("cached_tokens"))
        if found is not None:
            return found
    details = usage.get("input_tokens_details")
    if isinstance(details, Mapping):
        found = _count(details.get("cached_tokens"))
        if found is not None:
            return found
    return _count(usage.get("cache_read_input_tokens"))


def span_name(facts: SpanFacts) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}``, the GenAI conventions' span name."""
    return f"{facts.operation} {facts.requested}".strip()


def span_attributes(facts: SpanFacts) -> dict[str, str | int | float | bool]:
    attributes: dict[str, str | int | float | bool] = {
        "gen_ai.operation.name": facts.operation,
        "gen_ai.request.stream": facts.stream,
        "http.response.status_code": facts.status,
    }
    if facts.requested:
        attributes["gen_ai.request.model"] = facts.requested
    if facts.answered:
        attributes["gen_ai.response.model"] = facts.answered
    usage = facts.usage or {}
    for name, keys in (
        ("gen_ai.usage.input_tokens", ("prompt_tokens", "input_tokens")),
        ("gen_ai.usage.output_tokens", ("completion_tokens", "output_tokens")),
    ):
        for key in keys:
            found = _count(usage.get(key))
            if found is not None:
                attributes[name] = found
                break
    cached = cached_tokens(usage) if usage else None
    if cached is not None:
        attributes["gen_ai.usage.cache_read.input_tokens"] = cached
    if facts.time_to_first_token is not None:
        # The conventions' server metric of the same name, as the span's attribute.
        attributes["gen_ai.server.time_to_first_token"] = round(facts.time_to_first_token, 6)
    return attributes
