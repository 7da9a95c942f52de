"""An engine's error answer, read: whatever its shape, its message, its OpenAI-like
fields, and, for a request longer than the model's context, the token counts the
engine states.

Owns: the error shapes of the engines llmgw deploys, whole and in a stream, and the
words each release uses for a context overflow (see llmgw/gateway/DESIGN.md,
"Engine errors"):

- vLLM: ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``
  (its ``ErrorResponse``; older releases put the fields at the top);
- SGLang: ``{"object": "error", "message", "type", "param", "code": 400}`` at the
  top of a whole answer (``create_error_response``, serving_base.py), and
  ``{"error": {...the same...}}`` as a ``data:`` event of a stream that already
  answered 200 (``create_streaming_error_response``), ``type`` then an HTTP
  status's name (``BAD_REQUEST``) when the scheduler aborted the request;
- llama-server: ``{"error": {"code": 400, "message", "type":
  "exceed_context_size_error", "n_prompt_tokens", "n_ctx"}}``
  (``server_task_result_error::to_json``, tools/server/server-task.cpp, build 11434).

The translations render what is read here in their clients' shapes
(``llmgw.core.anthropic``, ``llmgw.core.responses``).

Must not: do I/O, or decide what a client is told (the translations do).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

# The HTTP status names SGLang writes as an in-stream error's ``type``
# (``code.name`` of an ``HTTPStatus``), for the status they stand for.
_STATUS_NAMES = {"BAD_REQUEST": 400, "REQUEST_ENTITY_TOO_LARGE": 413, "INTERNAL_SERVER_ERROR": 500}
# Codes and types that say "longer than the context" by themselves: OpenAI's code,
# llama-server's type.
_OVERFLOW_MARKS = frozenset({"context_length_exceeded", "exceed_context_size_error"})


@dataclass(frozen=True, slots=True)
class Overflow:
    """A request over the model's context, in the engine's numbers: ``input_tokens``
    (a lower bound when the engine did not count them, see ``_overflow``),
    ``max_tokens`` when the engine counted the answer's room in (else None: the input
    alone was over), ``context``."""

    input_tokens: int
    max_tokens: int | None
    context: int


@dataclass(frozen=True, slots=True)
class EngineError:
    status: int
    message: str | None  # None: the engine gave none
    code: str | None  # a string code (OpenAI's kind); engines' integer codes are dropped
    param: str | None
    too_long: bool  # the request is longer than the model's context
    overflow: Overflow | None  # its numbers, when the engine's words give them


# Each engine release's words for a request past the context, with the numbers they
# carry (named groups: input, max, context). Ordered: the first match wins.
_OVERFLOW_WORDS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern)
    for pattern in (
        # vLLM 0.11.0 (serving_engine.py, ``_validate_input``): the input and the answer's room.
        r"maximum context length is (?P<context>\d+) tokens\. However, you requested \d+ tokens "
        r"\((?P<input>\d+) in the messages, (?P<max>\d+) in the completion\)",
        # vLLM 0.11.0: the input alone.
        r"maximum context length is (?P<context>\d+) tokens\. However, your request has "
        r"(?P<input>\d+) input tokens",
        # vLLM 0.34.0 (vllm/renderers/params.py, ``_token_len_check``): the input alone;
        # "at least" when the tokenizer stopped one past the limit.
        r"maximum context length is (?P<context>\d+) tokens\. However, your prompt contains "
        r"(?:at least )?(?P<input>\d+) input tokens",
        # vLLM 0.34.0 (``_text_len_check``): characters, no token count.
        r"maximum context length is (?P<context>\d+) tokens\. However, your prompt contains \d+ characters",
        # vLLM's v1 input processor (0.11.0, 0.34.0): the input alone, or exactly the context.
        r"The decoder prompt \(length (?P<input>\d+)\) (?:plus the number of requested output tokens "
        r"\(at least 1\) )?is longer than the maximum model length of (?P<context>\d+)",
        # vLLM 0.34.0 (serve/utils/api_utils.py, ``get_max_tokens``).
        r"Input length \((?P<input>\d+)\) exceeds model's maximum context length \((?P<context>\d+)\)",
        # SGLang 0.5.3 and 0.5.23 (tokenizer_manager.py, ``_validate_one_request``).
        r"The input \((?P<input>\d+) tokens\) is longer than the model's context length "
        r"\((?P<context>\d+) tokens\)",
        r"maximum context length of (?P<context>\d+) tokens\. You requested a total of \d+ tokens: "
        r"(?P<input>\d+) tokens from the input messages and (?P<max>\d+) tokens for the completion",
        # SGLang 0.5.23's scheduler (managers/utils.py, ``validate_input_length``): its
        # limit is the longest input it takes, a few tokens under the context.
        r"Input length \((?P<input>\d+) tokens\) exceeds the maximum allowed length "
        r"\((?P<context>\d+) tokens\)",
        # SGLang 0.5.3 and 0.5.23 (serving_chat.py, ``_validate_request``): the answer's room
        # alone is over the context, refused before the input is counted.
        r"max_completion_tokens is too large: (?P<max>\d+)\.\s*This model supports at most "
        r"(?P<context>\d+) completion tokens",
        # llama-server (server-context.cpp, build 11434), when its fields are missing.
        r"request \((?P<input>\d+) tokens\) exceeds the available context size \((?P<context>\d+) tokens\)",
        r"input \((?P<input>\d+) tokens\) is larger than the max context size \((?P<context>\d+) tokens\)",
    )
)


def read(status: int, body: bytes | Mapping[str, object]) -> EngineError:
    """The engine's error: ``body`` is its answer's bytes, or a stream event's JSON."""
    data: object = body
    if isinstance(body, bytes):
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            data = None
    fields: Mapping[str, object] = {}
    if isinstance(data, Mapping):
        inner = data.get("error")
        fields = inner if isinstance(inner, Mapping) else data
    message = fields.get("message")
    message = message if isinstance(message, str) and message else None
    code, kind, param = fields.get("code"), fields.get("type"), fields.get("param")
    overflow = _overflow(fields, message)
    too_long = overflow is not None or any(
        isinstance(mark, str) and mark in _OVERFLOW_MARKS for mark in (code, kind)
    )
    return EngineError(
        status=status,
        message=message,
        code=code if isinstance(code, str) else None,
        param=param if isinstance(param, str) else None,
        too_long=too_long,
        overflow=overflow,
    )


def stream_status(error: Mapping[str, object]) -> int:
    """The HTTP status an in-stream error stands for: its integer ``code`` (every
    engine writes the status there), else its ``type`` when that names a status
    (SGLang's aborts), else 500."""
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return code
    kind = error.get("type")
    return _STATUS_NAMES.get(kind, 500) if isinstance(kind, str) else 500


def _overflow(fields: Mapping[str, object], message: str | None) -> Overflow | None:
    prompt, context = fields.get("n_prompt_tokens"), fields.get("n_ctx")
    if _positive(prompt) and _positive(context):  # llama-server states both as fields
        assert isinstance(prompt, int) and isinstance(context, int)
        return Overflow(prompt, None, context)
    if message is None:
        return None
    for pattern in _OVERFLOW_WORDS:
        found = pattern.search(message)
        if found is None:
            continue
        numbers = found.groupdict()
        given_max = numbers.get("max")
        given_input = numbers.get("input")
        context = int(numbers["context"])
        # Not counted: a lower bound. vLLM's character check proves the input is over
        # the context (a token is at most ``max_chars_per_token`` characters); SGLang's
        # refusal of the answer's room alone proves nothing of the input.
        uncounted = context + 1 if given_max is None else 0
        counted = int(given_input) if given_input is not None else uncounted
        return Overflow(counted, int(given_max) if given_max is not None else None, context)
    return None


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
