"""A client's API request, parsed into a typed ``ApiCall``, and the body sent upstream.

Owns: the checks that make a request forwardable (a JSON object with a ``model``
string and the fields its API cannot do without, each of the right type) with
OpenAI's 400 shape naming the ``param``; the fields never passed on (credentials
and routing a client must not choose); and the body the engine receives (the
client's, with ``model`` set to the model that serves it).

Everything else a client sends (tools, response_format, sampling options, fields
this router has never heard of) passes through untouched: engines decide.

Must not: choose endpoints or talk to anyone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llmgw.core.json_values import MAX_JSON_DEPTH, nested_deeper_than, utf8_encodable
from llmgw.core.routing import Api
from llmgw.gateway import errors

# Fields some SDKs and proxies read to choose where and with which credentials to
# call (LiteLLM's api_base, headers...). This router never honours them, and no
# engine should see them either: a client must not steer the router's outbound
# requests or smuggle credentials through it.
STRIPPED_FIELDS = frozenset(
    {
        "api_base", "base_url", "api_key", "api_version", "api_type", "organization", "project",
        "headers", "extra_headers", "custom_llm_provider", "azure_ad_token", "aws_access_key_id",
        "aws_secret_access_key", "aws_session_token", "vertex_credentials",
    }
)  # fmt: skip

# OpenAI's rule of thumb for English text; only the hold of a token-limited key uses it.
BYTES_PER_TOKEN = 4

# What may be a lone surrogate in the client's bytes: a ``\uD800``-``\uDFFF`` escape,
# or the UTF-8-shaped bytes of one (json.loads decodes with surrogatepass, so those
# are read too). Surrogate pairs (an emoji escaped by Python's json.dumps) match as
# well and then pass the full check; a body without a match pays nothing more.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")

API_PATHS = {
    Api.CHAT: "/v1/chat/completions",
    Api.COMPLETIONS: "/v1/completions",
    Api.EMBEDDINGS: "/v1/embeddings",
    Api.MESSAGES: "/v1/messages",
}


@dataclass(frozen=True, slots=True)
class ApiCall:
    api: Api
    model: str  # the name the client asked for (model or alias)
    stream: bool
    include_usage: bool  # the client asked for the usage chunk of a stream
    body: dict[str, object]  # the client's JSON object, minus STRIPPED_FIELDS
    # The client's bytes, when the engine may get them as they are (a UTF-8 JSON
    # object with no stripped field): serializing the body again for every request
    # costs as much as parsing it, and most requests name the model that serves them.
    raw: bytes | None = None
    size: int = 0  # of the client's body, in bytes

    @property
    def path(self) -> str:
        return API_PATHS[self.api]

    @property
    def unbounded(self) -> bool:
        """Whether nothing in the request bounds its answer (no ``max_completion_tokens``
        or ``max_tokens``; a Messages request always has ``max_tokens``): the engine
        writes until the model stops or its context is full."""
        if self.api in (Api.EMBEDDINGS, Api.MESSAGES):
            return False
        return not any(
            isinstance(self.body.get(name), int) for name in ("max_completion_tokens", "max_tokens")
        )

    def tokens_to_hold(self, unbounded_answer: int) -> int:
        """The most tokens this request may plausibly use, held from a key's budget
        until its usage is known: the prompt at about 4 bytes a token (the body's
        JSON counts, so this errs high), plus ``max_completion_tokens`` or
        ``max_tokens`` (else ``unbounded_answer``) for each of its ``n`` choices
        (a Messages request: its ``max_tokens``, once)."""
        prompt = -(-self.size // BYTES_PER_TOKEN)
        if self.api is Api.EMBEDDINGS:
            return prompt
        # Anthropic's API has neither max_completion_tokens nor n: its engine writes up
        # to max_tokens whatever they say (a client must not shrink its hold with them).
        messages = self.api is Api.MESSAGES
        cap = None if messages else self.body.get("max_completion_tokens")
        if cap is None:
            cap = self.body.get("max_tokens")
        choices = None if messages else self.body.get("n")
        answer = cap if isinstance(cap, int) else unbounded_answer
        return prompt + max(0, answer) * (choices if isinstance(choices, int) and choices > 1 else 1)

    def upstream_body(self, model: str, *, force_usage: bool) -> bytes:
        """The JSON the engine gets. ``force_usage`` asks a stream for its usage chunk
        even when the client did not (the router counts tokens; the chunk is then
        taken out of what the client sees)."""
        if (
            self.raw is not None
            and model == self.model
            and not (self.stream and force_usage and not self.include_usage)
        ):
            return self.raw
        body = dict(self.body)
        body["model"] = model
        if self.stream and force_usage and not self.include_usage:
            options = body.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _is_utf8_object(raw: bytes) -> bool:
    """Whether json.loads would read ``raw`` as UTF-8 (it starts an object, no NUL)."""
    return raw[:1] == b"{" and raw[1:2] != b"\x00"


def json_object(raw: bytes) -> dict[str, object]:
    """A request body's JSON object, or OpenAI's 400 for one it cannot read (the
    Responses API's too: ``llmgw.gateway.responses``)."""
    # A UTF-8 JSON object (what json.loads would detect) is decoded here the way
    # json.loads decodes it: its encoding detection costs as much as the rest.
    utf8 = _is_utf8_object(raw)
    try:
        body = json.loads(raw.decode("utf-8", "surrogatepass") if utf8 else raw)
    except (ValueError, UnicodeDecodeError):
        raise _unparsable() from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise errors.bad_request("The request body must be a JSON object.")
    # The door's depth check, before anything walks the body. A body with fewer opening
    # brackets than the limit cannot nest past it: most pay two byte counts, nothing more.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and nested_deeper_than(body, MAX_JSON_DEPTH):
        raise _too_deep()
    # A lone surrogate ("\ud800") is valid JSON syntax but no text: no UTF-8 holds it, so
    # a body with one cannot be sent on re-encoded (an alias, a guarded model, a stripped
    # field), and OpenAI refuses it as unparsable. Refused here for every request, so
    # the answer does not depend on the path the body would take.
    if (not utf8 or _maybe_surrogate(raw)) and not utf8_encodable(body):
        raise _unparsable()
    return body


def parse_call(api: Api, raw: bytes) -> ApiCall:
    """The request, or the 400 to answer (never a traceback)."""
    body = json_object(raw)
    utf8 = _is_utf8_object(raw)
    stripped = STRIPPED_FIELDS.intersection(body)
    for name in stripped:
        del body[name]
    # json.loads also reads UTF-16/32 (a NUL in the first bytes) and a BOM: those are re-encoded.
    passable = not stripped and utf8

    model = body.get("model")
    if model is None:
        raise errors.bad_request("you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise errors.bad_request(f"{_shown(model)} is not of type 'string' - 'model'", param="model")

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise errors.bad_request(f"{_shown(stream)} is not of type 'boolean' - 'stream'", param="stream")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise errors.bad_request(
                f"{_shown(options)} is not of type 'object' - 'stream_options'", param="stream_options"
            )
        usage = options.get("include_usage", False)
        if usage is not None and not isinstance(usage, bool):
            raise errors.bad_request(
                f"{_shown(usage)} is not of type 'boolean' - 'stream_options.include_usage'",
                param="stream_options.include_usage",
            )
        include_usage = bool(usage) and stream
    if api is Api.MESSAGES:
        include_usage = stream  # a Messages stream always reports usage (message_delta)
    if api is Api.EMBEDDINGS and stream:
        raise errors.bad_request("Embeddings cannot be streamed.", param="stream")

    if api in (Api.CHAT, Api.MESSAGES):
        _check_messages(body.get("messages"))
    elif api is Api.COMPLETIONS:
        _check_text_or_list(body, "prompt")
    else:
        _check_text_or_list(body, "input")
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise errors.bad_request(f"{_shown(value)} is not of type 'integer' - '{name}'", param=name)
    return ApiCall(
        api=api,
        model=model,
        stream=stream,
        include_usage=include_usage,
        body=body,
        raw=raw if passable else None,
        size=len(raw),
    )


def _too_deep() -> errors.ApiError:
    return errors.bad_request(
        f"The JSON body of your request is nested more than {MAX_JSON_DEPTH} levels deep; "
        "no API field needs that many."
    )


def _unparsable() -> errors.ApiError:
    # OpenAI's answer to a body it cannot read as JSON.
    return errors.bad_request(
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
        "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
        "sent was not valid JSON.)"
    )


def _maybe_surrogate(raw: bytes) -> bool:
    """Whether the client's bytes may hold a lone surrogate (``_MAYBE_SURROGATE``). Both
    of its shapes need a backslash-u or a byte past ASCII: most bodies have neither, and
    those two tests cost a fraction of the pattern's scan."""
    return (b"\\u" in raw or not raw.isascii()) and _MAYBE_SURROGATE.search(raw) is not None


def _check_messages(messages: object) -> None:
    if messages is None:
        raise errors.bad_request(
            "Missing required parameter: 'messages'.", param="messages", code="missing_required_parameter"
        )
    if not isinstance(messages, list):
        raise errors.bad_request(f"{_shown(messages)} is not of type 'array' - 'messages'", param="messages")
    if not messages:
        raise errors.bad_request(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise errors.bad_request(
                f"{_shown(message)} is not of type 'object' - 'messages.{index}'", param=f"messages.[{index}]"
            )
        role = message.get("role")
        if not isinstance(role, str):
            raise errors.bad_request(
                f"Missing required parameter: 'messages[{index}].role'.",
                param=f"messages.[{index}].role",
                code="missing_required_parameter",
            )


def _check_text_or_list(body: dict[str, object], name: str) -> None:
    """A completion's ``prompt`` or an embedding's ``input``: there, and a string or a list
    (its items are the engine's to check), refused in OpenAI's words otherwise."""
    value = body.get(name)
    if value is None:
        article = "an" if name[0] in "aeiou" else "a"
        raise errors.bad_request(f"you must provide {article} {name} parameter", param=name)
    if not isinstance(value, str | list):
        raise errors.bad_request(
            f"{_shown(value)} is not valid under any of the given schemas - '{name}'", param=name
        )


def _shown(value: object) -> str:
    """A value from the parsed body, as the error message quotes it."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."
