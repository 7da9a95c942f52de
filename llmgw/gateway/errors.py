"""OpenAI-shaped errors: the exception handlers raise, and the bytes clients receive.

Owns: ``ApiError`` (carries a ``routing.Refusal``), the constructors for the
router's own refusals (bad request, auth, rate limits, content policy), and the
two renderings: an HTTP response, and an SSE ``data: {"error": ...}`` event for a
stream whose head has already gone (the openai clients raise ``APIError`` on it).

Must not: decide routing (``llmgw.core.routing`` does) or log; the error
middleware decides what to log.
"""

from __future__ import annotations

import json

from aiohttp import web

from llmgw.core import anthropic
from llmgw.core.routing import Api, Refusal


class ApiError(Exception):
    """Raised anywhere under a handler; the error middleware renders it."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def response_for(refusal: Refusal, request_id: str | None = None, *, api: Api | None = None) -> web.Response:
    """The HTTP answer; ``api`` ``MESSAGES`` renders it in Anthropic's shape."""
    headers = {}
    if refusal.retry_after is not None:
        headers["Retry-After"] = str(refusal.retry_after)
    if not refusal.retryable:
        headers["x-should-retry"] = "false"
    if request_id:
        headers["x-request-id"] = request_id
    return web.Response(
        status=refusal.status,
        body=json.dumps(_body(refusal, api)).encode(),
        content_type="application/json",
        headers=headers,
    )


def sse_error_event(refusal: Refusal, api: Api | None = None) -> bytes:
    """The event that ends a stream whose answer failed midway, as OpenAI sends it
    (Anthropic's ``event: error`` for ``MESSAGES``)."""
    if api is Api.MESSAGES:
        return anthropic.error_event(refusal.status, refusal.message)
    return b"data: " + json.dumps(refusal.body(), separators=(",", ":")).encode() + b"\n\n"


def _body(refusal: Refusal, api: Api | None) -> object:
    if api is Api.MESSAGES:
        # Anthropic's shape has a type and a message only; the status says the rest.
        return anthropic.error_body(refusal.status, refusal.message)
    return refusal.body()


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(Refusal(400, message, "invalid_request_error", code, param=param, retryable=False))


def missing_key() -> ApiError:
    # OpenAI's wording (its code is null for a missing key).
    return ApiError(
        Refusal(
            401,
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            "invalid_request_error",
            None,
            retryable=False,
        )
    )


def missing_key_anthropic() -> ApiError:
    return ApiError(
        Refusal(
            401,
            "You didn't provide an API key: send it in the x-api-key header "
            "(or Authorization: Bearer YOUR_KEY).",
            "invalid_request_error",
            None,
            retryable=False,
        )
    )


def conflicting_keys() -> ApiError:
    return ApiError(
        Refusal(
            401,
            "The request carries two different API keys (Authorization and x-api-key); send one key, "
            "in one of them.",
            "invalid_request_error",
            "conflicting_api_keys",
            retryable=False,
        )
    )


def invalid_key(shown: str) -> ApiError:
    return ApiError(
        Refusal(
            401,
            f"Incorrect API key provided: {shown}. Ask your llmgw operator for a key.",
            "invalid_request_error",
            "invalid_api_key",
            retryable=False,
        )
    )


def cross_site_request(why: str) -> ApiError:
    return ApiError(
        Refusal(
            403,
            f"{why}; a router without API keys takes no requests from other sites' pages",
            "invalid_request_error",
            "cross_site_request",
            retryable=False,
        )
    )


def rate_limited(kind: str, limit: int, retry_after: int, *, requested: int | None = None) -> ApiError:
    """``kind`` is ``requests`` or ``tokens``, OpenAI's error type for RPM and TPM limits;
    ``requested``, the tokens the request would hold."""
    unit = "RPM" if kind == "requests" else "TPM"
    asked = f", Requested {requested}" if requested else ""
    return ApiError(
        Refusal(
            429,
            f"Rate limit reached on {kind} per min ({unit}): Limit {limit}{asked}. "
            f"Please try again in {retry_after}s.",
            kind,
            "rate_limit_exceeded",
            retry_after=retry_after,
        )
    )


def budget_exhausted(
    budget: int, period: str, left: int, requested: int, resets_at: str | None, retry_after: int | None
) -> ApiError:
    """The key's token budget for its period has less left than the request holds.

    OpenAI's answer for a quota spent (not a rate): 429 ``insufficient_quota`` (type and
    code), which the openai clients raise as ``RateLimitError`` and retry unless told not
    to: ``x-should-retry: false``, as a retry cannot succeed before the period resets
    (Retry-After says when; a ``lifetime`` budget never does)."""
    when = f"it resets at {resets_at}" if resets_at else "it does not reset (a lifetime budget)"
    asked = f" and this request holds {requested}" if requested and left else ""
    return ApiError(
        Refusal(
            429,
            f"You exceeded your current quota: this API key's token budget ({budget} tokens, {period}) "
            f"has {left} tokens left{asked}; {when}. Ask your llmgw operator for a larger budget.",
            "insufficient_quota",
            "insufficient_quota",
            retry_after=retry_after,
            retryable=False,
        )
    )


def too_many_at_once(limit: int) -> ApiError:
    return ApiError(
        Refusal(
            429,
            f"This API key has {limit} requests in progress on this router, its limit: wait for one "
            "to finish.",
            "requests",
            "concurrency_limit_exceeded",
            retry_after=1,
        )
    )


def limits_unavailable() -> ApiError:
    """Redis, where every router's limits are kept, does not answer, and the operator
    chose to refuse rather than admit on this router's share (``--limits-store-down closed``)."""
    return ApiError(
        Refusal(
            503,
            "Rate limits cannot be checked right now (their store is unreachable); try again shortly.",
            "server_error",
            "limits_unavailable",
            retry_after=5,
        )
    )


def budget_not_kept() -> ApiError:
    """A key with a token budget on a router that shares no Redis: the budget cannot be
    held there (each router alone would count its own), so the key is refused. The
    router's configuration, not a passing state: no Retry-After, and ``x-should-retry:
    false`` so a client does not retry what only an operator can change."""
    return ApiError(
        Refusal(
            503,
            "This API key has a token budget, which this router cannot check (it shares no store of "
            "limits with the other routers); ask your llmgw operator.",
            "server_error",
            "limits_unavailable",
            retryable=False,
        )
    )


def queue_full(model: str, retry_after: int) -> ApiError:
    return ApiError(
        Refusal(
            429,
            f"The model `{model}` has too many requests waiting on this router; retry in {retry_after}s.",
            "rate_limit_error",
            "model_queue_full",
            retry_after=retry_after,
        )
    )


def content_policy(categories: tuple[str, ...]) -> ApiError:
    listed = f" (categories: {', '.join(categories)})" if categories else ""
    return ApiError(
        Refusal(
            400,
            f"Your request was rejected by the content policy{listed}.",
            "invalid_request_error",
            "content_policy_violation",
            retryable=False,
        )
    )


def screen_refused() -> ApiError:
    """The judge would not read the request (its 4xx): refused, not let through."""
    return ApiError(
        Refusal(
            400,
            "Your request was rejected by the content policy: the content screen could not read it.",
            "invalid_request_error",
            "content_policy_violation",
            retryable=False,
        )
    )


def too_long_to_screen(model: str) -> ApiError:
    # OpenAI's code for a prompt over a context, so clients that shorten on it do.
    return ApiError(
        Refusal(
            400,
            f"The request is longer than the content screen for `{model}` can read, so it was refused; "
            "shorten the conversation.",
            "invalid_request_error",
            "context_length_exceeded",
            param="messages",
            retryable=False,
        )
    )


def guard_unavailable(model: str, judge_refusal: Refusal | None = None) -> ApiError:
    """``judge_refusal``: the router's own answer for the judge, when that is why it did
    not answer. A judge that will not answer soon (no place for it, not in the catalog,
    drained) makes the screen's 503 one a client should not retry (``x-should-retry:
    false``); one loading or without a healthy replica now keeps its Retry-After."""
    retryable = judge_refusal is None or judge_refusal.retryable
    retry_after = judge_refusal.retry_after if judge_refusal is not None else None
    return ApiError(
        Refusal(
            503,
            f"The content screen for `{model}` is unavailable and requests are blocked until it is back.",
            "server_error",
            "guard_unavailable",
            retry_after=(retry_after or 5) if retryable else retry_after,
            retryable=retryable,
        )
    )


def stream_broken(model: str) -> Refusal:
    return Refusal(
        502,
        f"The model `{model}` stopped answering midway; the output above is incomplete.",
        "server_error",
        "upstream_stream_broken",
    )


def upstream_unreadable(model: str) -> Refusal:
    """An engine's 200 whose body is not the answer asked for (a proxy's page, a cut
    body): a 502, as for any engine failure, never a 200 carrying an error."""
    return Refusal(
        502, f"The model `{model}` answered with unreadable JSON.", "server_error", "upstream_unreadable"
    )


def stream_timeout(model: str) -> Refusal:
    return Refusal(
        504,
        f"The model `{model}` went silent midway; the output above is incomplete.",
        "server_error",
        "upstream_timeout",
    )


def internal_error() -> Refusal:
    return Refusal(500, "The router failed to handle this request.", "server_error", "internal_error")


def not_found_url(method: str, path: str) -> Refusal:
    # OpenAI's wording for an unknown URL.
    return Refusal(
        404,
        f"Invalid URL ({method} {path})",
        "invalid_request_error",
        "unknown_url",
        retryable=False,
    )


def method_not_allowed(method: str, path: str) -> Refusal:
    return Refusal(
        405,
        f"Method {method} is not allowed on {path}.",
        "invalid_request_error",
        "method_not_allowed",
        retryable=False,
    )


def guarded_body_too_large(model: str, limit: int) -> Refusal:
    return Refusal(
        413,
        f"The model `{model}` screens requests with a guard policy, which reads bodies of at most "
        f"{limit} bytes: send a shorter conversation.",
        "invalid_request_error",
        "request_too_large",
        retryable=False,
    )


def body_too_large(limit: int) -> Refusal:
    return Refusal(
        413,
        f"The request body is larger than {limit} bytes.",
        "invalid_request_error",
        "request_too_large",
        retryable=False,
    )


def body_encoding_refused(encoding: str) -> Refusal:
    # The OpenAI and Anthropic SDKs send plain JSON; a compressed body's inflated size
    # is not its wire size (``llmgw.http_server.read_body``).
    return Refusal(
        415,
        f"A request body with Content-Encoding {encoding[:40]!r} is not accepted: send the JSON "
        "uncompressed (as the OpenAI and Anthropic SDKs do).",
        "invalid_request_error",
        "unsupported_content_encoding",
        param="Content-Encoding",
        retryable=False,
    )
