"""The OpenAI wire format, as the simulated engine speaks it.

Owns: parsing request bodies (already decoded JSON) into typed requests,
raising `ApiError` with OpenAI's error envelope when they are unusable, and
building the exact JSON objects of responses, stream chunks and errors.

Must not: do I/O, sleep, or hold state. Unknown request fields are ignored,
as OpenAI-compatible engines do, so tool-calling clients pass through.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.core.json_values import json_kind
from llmgw.sim import vocabulary

SSE_DONE = b"data: [DONE]\n\n"


class ErrorType(enum.StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    SERVER = "server_error"
    # vLLM's own type for the errors its input checks raise (an over-long prompt).
    VLLM_BAD_REQUEST = "BadRequestError"


class ApiError(Exception):
    """An OpenAI-shaped error answer: ``{"error": {"message", "type", "param", "code"}}``.

    A plain exception rather than a frozen dataclass: Python sets attributes on
    exceptions in flight (``__notes__``), which a frozen dataclass would refuse.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: ErrorType = ErrorType.INVALID_REQUEST,
        param: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": str(self.type),
                "param": self.param,
                "code": self.code,
            }
        }


def bad_json() -> ApiError:
    return ApiError(
        400,
        "We could not parse the JSON body of your request. Send a JSON object with "
        "Content-Type: application/json.",
    )


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found",
    )


def not_ready(reason: str) -> ApiError:
    return ApiError(503, f"The engine is not ready yet: {reason}. Retry later.", ErrorType.SERVER)


def injected_failure(status: int) -> ApiError:
    if status == 503:
        return ApiError(503, "The engine is currently overloaded, please try again later.", ErrorType.SERVER)
    return ApiError(
        status, "The server had an error while processing your request. Sorry about that!", ErrorType.SERVER
    )


def _missing(param: str) -> ApiError:
    return ApiError(
        400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _invalid_type(param: str, expected: str, value: object) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {json_kind(value)} instead.",
        param=param,
        code="invalid_type",
    )


class Endpoint(enum.StrEnum):
    CHAT = "chat.completion"
    COMPLETION = "text_completion"


@dataclass(frozen=True)
class GenerationRequest:
    """A chat or text completion reduced to what the simulator needs."""

    endpoint: Endpoint
    model: str
    prompt: str  # the text the completion's content is derived from
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    # The answer ends with a stop before max_tokens (``--answer-tokens``): the engine's
    # max_tokens is then the answer's length.
    stops: bool = False
    # The names of the function tools the request offers (none when its tool_choice is
    # "none"), and whether its last message is a tool's result: what ``tool_call_for``
    # decides a tool call by.
    tools: tuple[str, ...] = ()
    after_tool_result: bool = False
    # A chat request that sets no max_tokens: its budget is the rest of the context (as
    # vLLM's), so the answer ends at the model's own stop, never at that budget.
    open_ended: bool = False

    @property
    def finish_reason(self) -> str:
        """The simulator never emits a stop token unless told to: it runs to max_tokens."""
        return "stop" if self.stops else "length"

    def answered(self, answer_tokens: int, open_answer_tokens: int) -> GenerationRequest:
        """This request as a model that says ``answer_tokens`` (0: no limit) and stops; an
        open-ended request (no max_tokens) with no such limit stops after ``open_answer_tokens``."""
        if not answer_tokens and self.open_ended:
            answer_tokens = open_answer_tokens
        if not answer_tokens or answer_tokens >= self.max_tokens:
            return self
        return dataclasses.replace(self, max_tokens=answer_tokens, stops=True)


@dataclass(frozen=True)
class ToolCall:
    """One tool call an answer makes (``--tool-calls``)."""

    id: str
    name: str
    arguments: str  # JSON text, as vLLM's tool parsers put it in ``function.arguments``

    def pieces(self) -> list[str]:
        """The arguments as the tokens they stream in (each with the space before it)."""
        return re.findall(r"\s*\S+", self.arguments) or [self.arguments]


def tool_call_for(
    tool_calls: Sequence[tuple[str, str]], request: GenerationRequest, call_id: str
) -> ToolCall | None:
    """The call a ``--tool-calls`` model answers ``request`` with: the first of its tools
    the request offers, unless the request's last message is a tool's result (the model
    then answers it in text, so an agent's loop ends)."""
    if request.after_tool_result or request.endpoint is not Endpoint.CHAT:
        return None
    for name, arguments in tool_calls:
        if name in request.tools:
            return ToolCall(call_id, name, arguments)
    return None


def _function_tools(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the chat request's function tools; none under ``tool_choice: "none"``."""
    tools = body.get("tools")
    if body.get("tool_choice") == "none" or not isinstance(tools, list):
        return ()
    names = (
        tool.get("function", {}).get("name")
        for tool in tools
        if isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(tool.get("function"), dict)
    )
    return tuple(name for name in names if isinstance(name, str))


class EncodingFormat(enum.StrEnum):
    FLOAT = "float"
    BASE64 = "base64"


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str, ...]
    input_tokens: tuple[int, ...]
    encoding_format: EncodingFormat
    dimensions: int | None


@dataclass(frozen=True)
class Limits:
    """The engine limits a request is checked against."""

    default_max_tokens: int
    max_model_len: int
    embedding_dim: int


def require_object(body: object) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise bad_json()
    return body


def requested_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise _missing("model")
    if not isinstance(model, str):
        raise _invalid_type("model", "a string", model)
    return model


def _optional_int(body: Mapping[str, Any], param: str, minimum: int) -> int | None:
    value = body.get(param)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid_type(param, "an integer", value)
    if value < minimum:
        raise ApiError(
            400,
            f"Invalid '{param}': integer below minimum value. Expected a value >= {minimum}, "
            f"but got {value} instead.",
            param=param,
            code="integer_below_min_value",
        )
    return value


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _invalid_type("stream", "a boolean", stream)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise _invalid_type("stream_options", "an object", options)
    if not stream:
        raise ApiError(
            400,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
    include_usage = options.get("include_usage")
    if include_usage is None:
        include_usage = False
    if not isinstance(include_usage, bool):
        raise _invalid_type("stream_options.include_usage", "a boolean", include_usage)
    return stream, include_usage


def _refuse_n(body: Mapping[str, Any]) -> None:
    n = _optional_int(body, "n", 1)
    if n is not None and n > 1:
        raise ApiError(
            400,
            "This engine returns one choice per request: n must be 1.",
            param="n",
            code="unsupported_value",
        )


def check_context(prompt_tokens: int, max_tokens: int, limits: Limits) -> None:
    """vLLM's answer to a prompt its context cannot hold: HTTP 400 with its own envelope
    (type ``BadRequestError``, ``code`` the HTTP status, no ``param``) and wording.
    A guard's judge answers a padded prompt this way: the router must read it as a
    refusal of the client's input, not as an engine that is down."""
    if prompt_tokens >= limits.max_model_len:
        message = (
            f"This model's maximum context length is {limits.max_model_len} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the input messages."
        )
    elif prompt_tokens + max_tokens > limits.max_model_len:
        message = (
            f"This model's maximum context length is {limits.max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    else:
        return
    raise ApiError(400, message, ErrorType.VLLM_BAD_REQUEST, code=400)


def message_text(message: object, index: int) -> str:
    if not isinstance(message, dict):
        raise _invalid_type(f"messages[{index}]", "an object", message)
    role = message.get("role")
    if not isinstance(role, str):
        raise (
            _missing(f"messages[{index}].role")
            if role is None
            else _invalid_type(f"messages[{index}].role", "a string", role)
        )
    content = message.get("content")
    if content is None:  # an assistant turn that only calls tools
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Content parts: only text parts carry tokens here; images and audio are ignored.
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        ]
        return " ".join(texts)
    raise _invalid_type(f"messages[{index}].content", "a string or an array", content)


def parse_chat(body: Mapping[str, Any], limits: Limits) -> GenerationRequest:
    """A `POST /v1/chat/completions` body; `max_completion_tokens` wins over `max_tokens`."""
    model = requested_model(body)
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array", messages)
    if not messages:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    prompt = "\n".join(message_text(message, index) for index, message in enumerate(messages))
    _refuse_n(body)
    max_completion = _optional_int(body, "max_completion_tokens", 1)
    max_tokens = _optional_int(body, "max_tokens", 1)
    chosen = max_completion if max_completion is not None else max_tokens
    stream, include_usage = _stream_flags(body)
    prompt_tokens = vocabulary.count_tokens(prompt)
    if chosen is None:
        # vLLM's chat default (get_max_tokens, vllm/entrypoints/serve/utils/api_utils.py,
        # 0.34.0): the rest of the context, never the completions' 16.
        check_context(prompt_tokens, 0, limits)
        budget = limits.max_model_len - prompt_tokens
    else:
        budget = chosen
        check_context(prompt_tokens, budget, limits)
    last = messages[-1]
    return GenerationRequest(
        Endpoint.CHAT, model, prompt, prompt_tokens, budget, stream, include_usage,
        tools=_function_tools(body), after_tool_result=isinstance(last, dict) and last.get("role") == "tool",
        open_ended=chosen is None,
    )  # fmt: skip


def _prompt_of(value: object, param: str) -> tuple[str, int]:
    """A single prompt (text or token ids) as (text to hash, token count)."""
    if isinstance(value, str):
        return value, vocabulary.count_tokens(value)
    if isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        return json.dumps(value), len(value)
    raise _invalid_type(param, "a string, an array of strings or an array of token ids", value)


def _single_input(value: object, param: str, noun: str) -> object:
    """Unwrap a one-element batch; batches of several are refused (one choice per request)."""
    if isinstance(value, list) and value and all(isinstance(item, str | list) for item in value):
        if len(value) > 1:
            raise ApiError(
                400, f"This engine takes one {noun} per request.", param=param, code="unsupported_value"
            )
        return value[0]
    return value


def parse_completion(body: Mapping[str, Any], limits: Limits) -> GenerationRequest:
    """A legacy `POST /v1/completions` body: one prompt, as text or token ids."""
    model = requested_model(body)
    if "prompt" not in body:
        raise _missing("prompt")
    prompt, prompt_tokens = _prompt_of(_single_input(body["prompt"], "prompt", "prompt"), "prompt")
    _refuse_n(body)
    max_tokens = _optional_int(body, "max_tokens", 1)
    stream, include_usage = _stream_flags(body)
    budget = max_tokens if max_tokens is not None else limits.default_max_tokens
    check_context(prompt_tokens, budget, limits)
    return GenerationRequest(Endpoint.COMPLETION, model, prompt, prompt_tokens, budget, stream, include_usage)


def parse_embeddings(body: Mapping[str, Any], limits: Limits) -> EmbeddingRequest:
    """A `POST /v1/embeddings` body: a string, strings, token ids or lists of token ids."""
    model = requested_model(body)
    if "input" not in body:
        raise _missing("input")
    raw = body["input"]
    items: Sequence[object]
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(i, int) for i in raw)):
        items = [raw]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise ApiError(
            400,
            "'input' must be a non-empty string or a non-empty array.",
            param="input",
            code="invalid_value",
        )
    texts: list[str] = []
    counts: list[int] = []
    for item in items:
        if item == "":
            raise ApiError(
                400, "'input' cannot contain an empty string.", param="input", code="invalid_value"
            )
        text, count = _prompt_of(item, "input")
        texts.append(text)
        counts.append(count)
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = EncodingFormat.FLOAT
    if encoding not in ("float", "base64"):
        raise ApiError(
            400,
            f"Invalid 'encoding_format': expected 'float' or 'base64', but got {encoding!r}.",
            param="encoding_format",
            code="invalid_value",
        )
    dimensions = _optional_int(body, "dimensions", 1)
    if dimensions is not None and dimensions > limits.embedding_dim:
        raise ApiError(
            400,
            f"Invalid 'dimensions': this model's embeddings have at most {limits.embedding_dim} dimensions.",
            param="dimensions",
            code="invalid_value",
        )
    return EmbeddingRequest(model, tuple(texts), tuple(counts), EncodingFormat(encoding), dimensions)


@dataclass(frozen=True)
class ResponseIdentity:
    """What every object of one response shares."""

    id: str
    created: int
    model: str
    system_fingerprint: str


def system_fingerprint(served_name: str) -> str:
    """Stable per served model, shaped like OpenAI's ``fp_…``."""
    return "fp_" + hashlib.sha256(served_name.encode("utf-8")).hexdigest()[:10]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _head(identity: ResponseIdentity, obj: str) -> dict[str, Any]:
    return {
        "id": identity.id,
        "object": obj,
        "created": identity.created,
        "model": identity.model,
        "system_fingerprint": identity.system_fingerprint,
    }


def completion_body(
    request: GenerationRequest,
    identity: ResponseIdentity,
    text: str,
    completion_tokens: int,
    finish_reason: str,
    reasoning: str | None = None,
) -> dict[str, Any]:
    """The whole (non-streamed) answer of a chat or text completion. A chat answer's
    ``reasoning`` goes in ``reasoning_content``, as vLLM's reasoning parser puts it
    (``ChatMessage``, vllm/entrypoints/openai/protocol.py of 0.11.0), and an answer
    that only reasoned has no content (``null``)."""
    choice: dict[str, Any]
    if request.endpoint is Endpoint.CHAT:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if reasoning is not None:
            message["content"] = text or None
            message["reasoning_content"] = reasoning
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    body = _head(identity, str(request.endpoint))
    body["choices"] = [choice]
    body["usage"] = usage(request.prompt_tokens, completion_tokens)
    return body


def tool_call_body(
    request: GenerationRequest, identity: ResponseIdentity, call: ToolCall, completion_tokens: int
) -> dict[str, Any]:
    """A whole chat answer that calls a tool, as vLLM 0.11.0 answers one its tool parser
    found (``serving_chat.py``'s ``chat_completion_full_generator``): no content, the
    call in ``tool_calls`` (``ToolCall``: ``id``, ``type: "function"``, ``function`` with
    ``name`` and JSON ``arguments``), ``finish_reason: "tool_calls"``."""
    message = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        ],
    }
    body = _head(identity, str(request.endpoint))
    body["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}]
    body["usage"] = usage(request.prompt_tokens, completion_tokens)
    return body


def tool_call_chunk(
    request: GenerationRequest, identity: ResponseIdentity, call: ToolCall, piece: str | None
) -> dict[str, Any]:
    """A streamed piece of a tool call, as vLLM's tool parsers stream one (``DeltaToolCall``
    dumped without unset fields): first the call's ``id``, ``type`` and ``function.name``
    (``piece`` None), then its arguments a piece at a time, each under ``index`` 0."""
    function = {"name": call.name} if piece is None else {"arguments": piece}
    tool_call: dict[str, Any] = {"index": 0, "function": function}
    if piece is None:
        tool_call = {"id": call.id, "type": "function", **tool_call}
    body = _head(identity, "chat.completion.chunk")
    body["choices"] = [
        {"index": 0, "delta": {"tool_calls": [tool_call]}, "logprobs": None, "finish_reason": None}
    ]
    if request.include_usage:
        body["usage"] = None
    return body


def _chunk_object(endpoint: Endpoint) -> str:
    return "chat.completion.chunk" if endpoint is Endpoint.CHAT else "text_completion"


def chunk(
    request: GenerationRequest,
    identity: ResponseIdentity,
    piece: str | None,
    finish_reason: str | None = None,
    *,
    role: bool = False,
    reasoning: bool = False,
) -> dict[str, Any]:
    """One streamed chunk with one choice.

    Chat: the first chunk carries ``{"role": "assistant", "content": ""}``, the
    last an empty delta with the finish reason (as OpenAI streams); a ``reasoning``
    piece is the delta's ``reasoning_content`` (vLLM's ``DeltaMessage``). Text
    completions carry ``text`` instead of a delta. With ``include_usage`` every
    chunk has ``"usage": null`` and a final `usage_chunk` follows.
    """
    choice: dict[str, Any]
    if request.endpoint is Endpoint.CHAT:
        delta: dict[str, Any] = {}
        if role:
            delta = {"role": "assistant", "content": "", "refusal": None}
        elif piece is not None:
            delta = {"reasoning_content" if reasoning else "content": piece}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"text": piece or "", "index": 0, "logprobs": None, "finish_reason": finish_reason}
    body = _head(identity, _chunk_object(request.endpoint))
    body["choices"] = [choice]
    if request.include_usage:
        body["usage"] = None
    return body


def usage_chunk(
    request: GenerationRequest, identity: ResponseIdentity, completion_tokens: int
) -> dict[str, Any]:
    """The chunk ``include_usage`` asks for: no choices, the whole request's usage."""
    body = _head(identity, _chunk_object(request.endpoint))
    body["choices"] = []
    body["usage"] = usage(request.prompt_tokens, completion_tokens)
    return body


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event, ``data: {...}\\n\\n``, compact JSON as OpenAI sends it."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"


def embeddings_body(
    request: EmbeddingRequest, served_name: str, vectors: Sequence[tuple[float, ...]]
) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for index, vector in enumerate(vectors):
        encoded: object = (
            vocabulary.embedding_base64(vector)
            if request.encoding_format is EncodingFormat.BASE64
            else list(vector)
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(request.input_tokens)
    return {
        "object": "list",
        "data": data,
        "model": served_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def models_body(served_name: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": served_name, "object": "model", "created": created, "owned_by": "llmgw-sim"}],
    }
