"""Guard policies: screening a request with a judge model before it reaches its model.

Owns: which policies apply to a request (those of any model in its fallback
chain, so falling back never skips a screen), the conversation the judge sees,
the strict reading of the judge's verdict, and what a judge failure means
(``on_error``: block, the default, fails closed; allow fails open).

The verdict rule is strict on purpose. Llama Guard answers ``safe``, or
``unsafe`` and a line of categories (``S1,S10``). Only an answer that is exactly
``safe`` (surrounding whitespace aside) lets a request through; ``unsafe`` blocks
it with its categories; ANY other text blocks it too, as unsafe, whatever
``on_error`` says: an answer the router cannot read is not evidence of safety,
and a prompt that makes the judge babble must not get past it. ``on_error`` is
for a judge that does not answer at all: no replica, connection failures, a
timeout, the judge's 5xx. A judge that answers 4xx refused the input the client
chose (a prompt padded past its context, an image it cannot take), and a client
must not turn the screen off by choosing such input: that is a block, whatever
``on_error`` says. A judge's answer that the conversation is longer than its
context is the policy's ``on_too_long``: block (the default), or split, which
judges overlapping pieces until each fits (at most ``guard_max_pieces`` judge
calls), every one of which must be safe. A simulated judge answers Greek words,
so it blocks everything: that is the honest outcome of guarding with a model
that cannot judge.

What is screened is everything the client wrote that the model will read as text:
every message, whatever its role (a ``tool`` message or a leading ``assistant`` one
is the client's text all the same, and chat templates render roles they do not
know: the role's own name too, when it is not one of the usual ones), the fields
of a message that chat templates render beside its content (its ``name``, the
tool calls it carries: their ids, function names and arguments; a legacy
``function_call``; a tool message's ``tool_call_id``; a developer message's
``tools``; ``task``; earlier turns' reasoning),
the fields beside the messages (tool and function definitions, documents,
template variables), and the whole prompt with its suffix. A chat template sent
with the request (``chat_template``, or ``chat_template_kwargs.chat_template``)
is refused: it decides what the model reads from the screened text. A message whose only
text is one of those fields is screened like any other: only a request with no
text at all skips the judge. A prompt of token ids cannot be read here, so a
guarded model refuses it; so is any content part that is not text (an image,
audio, a file, a video), since it can carry what the text screen would have
blocked, except images when the policy says its judge reads them
(``judge_reads_images``: they go to the judge beside the text). The model then
gets the body the guard read, serialized again, never the client's bytes: a JSON
parser that reads duplicate keys otherwise than Python's must not see other
messages than the judge did.

Must not: route (the dispatcher calls the judge like any model) or change the
request it screens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from http import HTTPStatus

from llmgw.core import anthropic, routing
from llmgw.core.catalog import Catalog, GuardErrorPolicy, GuardPolicy, GuardTooLongPolicy
from llmgw.gateway import errors
from llmgw.gateway.calls import ApiCall
from llmgw.gateway.dispatch import Dispatcher
from llmgw.gateway.errors import ApiError
from llmgw.gateway.metrics import RouterMetrics
from llmgw.gateway.settings import RouterSettings

log = logging.getLogger("llmgw.gateway.guard")

_CATEGORY = re.compile(r"^S\d{1,3}$")
# Chat request fields outside the messages whose text chat templates put in the
# prompt: tool and function definitions (names, descriptions, parameter schemas),
# vLLM's ``documents`` and ``chat_template_kwargs``, and ``reasoning_effort`` (gpt-oss's
# template writes it into the system prompt: "Reasoning: {effort}").
_RENDERED_FIELDS = ("tools", "functions", "documents", "chat_template_kwargs", "reasoning_effort")
# Request fields that force the model's output (structured outputs): a JSON schema's
# property names, enum values and descriptions, a choice, a regex or a grammar are
# text the model is made to write, so the judge reads them as the client's. vLLM
# 0.11.0's ChatCompletionRequest and CompletionRequest (vllm/entrypoints/openai/
# protocol.py) take response_format, structured_outputs and the guided_* fields;
# 0.34.0 keeps response_format and structured_outputs (json, regex, choice, grammar,
# structural_tag: StructuredOutputsParams in vllm/sampling_params.py); SGLang 0.5.23's
# ChatCompletionRequest adds regex and ebnf (sglang/srt/entrypoints/openai/protocol.py).
# A Responses request's text.format arrives here as response_format.
_OUTPUT_CONSTRAINT_FIELDS = (
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "guided_whitespace_pattern", "regex", "ebnf",
)  # fmt: skip
# ``chat_template_kwargs`` keys that are parameters of the tokenizer's
# ``apply_chat_template`` (transformers), not template variables: SGLang passes the
# kwargs through as they are, so these replace the template or truncate the prompt.
_TEMPLATE_CHANGING_KWARGS = ("chat_template", "truncation", "max_length", "tokenizer_kwargs")
# Message fields beside ``content`` that reach the template: vLLM's
# ``_parse_chat_message_content`` (vllm/entrypoints/chat_utils.py) passes on a
# message's ``name``, ``task``, a tool message's ``tool_call_id`` (Mistral's
# templates write it) and a developer message's ``tools``; and earlier turns' reasoning.
_RENDERED_MESSAGE_FIELDS = ("name", "reasoning_content", "reasoning", "tool_call_id", "task", "tools")
# Roles chat templates know; any other is written into the prompt as it is
# (Llama 3.1's template writes every role between its header tokens), so its name is screened.
_KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function", "ipython"})
# How an engine says a prompt is longer than its context (HTTP 400): vLLM's "This
# model's maximum context length is N tokens..." and, with images, "The decoder
# prompt (length N) is longer than the maximum model length of M"; SGLang's "...
# exceeds the model's maximum context length"; llama.cpp's type
# ``exceed_context_size_error`` ("exceeds the available context size"); OpenAI's code.
_TOO_LONG_WORDS = ("context length", "maximum model length", "context size")
_TOO_LONG_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
# A guarded body larger than this is read in a worker thread: under it, the reading
# costs less than the thread's hand-off (tens of microseconds), over it it may cost
# milliseconds of CPU (a 64 KiB body of one-letter turns: about 1 ms here).
_SCREEN_ON_LOOP_BYTES = 64 * 1024
# A text piece shorter than this is not split again: a judge that cannot read it
# cannot judge anything.
_MIN_SPLIT_CHARS = 64


@dataclass(frozen=True, slots=True)
class Verdict:
    safe: bool
    categories: tuple[str, ...] = ()
    readable: bool = True


def parse_verdict(text: str) -> Verdict:
    """``safe`` -> safe; ``unsafe`` (+ ``S1,S2``) -> unsafe; anything else -> unsafe, unreadable."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines == ["safe"]:
        return Verdict(safe=True)
    if lines and lines[0] == "unsafe" and len(lines) <= 2:
        categories: tuple[str, ...] = ()
        if len(lines) == 2:
            parts = tuple(part.strip() for part in lines[1].split(","))
            if not all(_CATEGORY.match(part) for part in parts):
                return Verdict(safe=False, readable=False)
            categories = parts
        return Verdict(safe=False, categories=categories)
    return Verdict(safe=False, readable=False)


def policies_for(catalog: Catalog, chain: Iterable[str]) -> list[tuple[str, GuardPolicy]]:
    found: dict[str, GuardPolicy] = {}
    for model in chain:
        policy = catalog.guard_policy_for(model)
        if policy is not None:
            found.setdefault(policy[0], policy[1])
    return sorted(found.items())


def judge_messages(call: ApiCall, *, images: bool = False) -> list[dict[str, object]]:
    """The conversation as Llama Guard's template takes it: user and assistant turns
    alternating, starting with the user. Every role but ``assistant`` (system,
    developer, tool, function, any other) is screened as the user's, and so is an
    assistant turn before the first user one: it is all the client's text. A turn's
    content is its text, or with ``images`` (a judge that reads them) its text and
    image parts. Raises the 400 for what cannot be screened: a prompt of token ids,
    a content part that is not text (or an image, with ``images``)."""
    return _as_messages(_judge_turns(call, images))


def _judge_turns(call: ApiCall, images: bool) -> list[Turn]:
    if call.api is routing.Api.MESSAGES:
        # A native engine gets the Messages body itself: what the translation leaves out
        # or carries where the chat screen does not look is read too.
        unread = Turn("user", "\n".join(_strings(_untranslated_strings(call.body))))
        return _merged([*_judge_turns(_as_chat_call(call), images), unread])
    turns: list[Turn] = []
    if call.api is routing.Api.CHAT:
        _refuse_request_template(call)
        rendered = (*_RENDERED_FIELDS, *_OUTPUT_CONSTRAINT_FIELDS)
        turns.append(Turn("user", "\n".join(_strings([call.body.get(name) for name in rendered]))))
        messages = call.body.get("messages")
        for message in messages if isinstance(messages, list) else []:
            if not isinstance(message, Mapping):
                continue
            text, images_of = _message_turn(message, call.model, images)
            turns.append(Turn("assistant" if message.get("role") == "assistant" else "user", text, images_of))
    else:
        prompt = call.body.get("prompt")
        if isinstance(prompt, list) and not all(isinstance(part, str) for part in prompt):
            raise errors.bad_request(
                f"The model `{call.model}` screens prompts with a guard policy, which reads text: "
                "send the prompt as text, not token ids.",
                param="prompt",
            )
        lines = prompt if isinstance(prompt, list) else []  # strings only: checked above
        turns.append(Turn("user", prompt if isinstance(prompt, str) else "\n".join(lines)))
        suffix = call.body.get("suffix")
        if isinstance(suffix, str):
            turns.append(Turn("user", suffix))
        constraints = _strings([call.body.get(name) for name in _OUTPUT_CONSTRAINT_FIELDS])
        turns.append(Turn("user", "\n".join(constraints)))
    return _merged(turns)


def _as_chat_call(call: ApiCall) -> ApiCall:
    """A Messages request as the chat completion it comes to (``anthropic.to_chat``:
    the system prompt, every text block, tool_use ids, names and inputs, tool_result
    contents, tool definitions), screened as one. A field that translation does not
    carry is one this screen cannot read: refused, whether or not the engine would
    take it (a guarded model's request reaches its engine only as screened)."""
    try:
        chat = anthropic.to_chat(call.body)
    except anthropic.Untranslatable as exc:
        raise errors.bad_request(
            f"The model `{call.model}` screens requests with a guard policy, which cannot read "
            f"`{exc.param}` ({exc}); leave it out.",
            param=exc.param,
        ) from None
    return replace(call, api=routing.Api.CHAT, body=chat, raw=None)


def _untranslated_strings(body: Mapping[str, object]) -> list[object]:
    """The parts of a Messages body that reach a native engine but not the chat screen:
    ``stop_sequences`` and ``metadata`` (carried as ``stop`` and ``user``, which no
    template renders), and each block's and tool's ``cache_control``, ``citations``
    (their ``cited_text`` is text) and a thinking block's ``signature`` (accepted and
    not carried)."""
    found: list[object] = [body.get("stop_sequences"), body.get("metadata")]
    blocks: list[object] = []
    system = body.get("system")
    if isinstance(system, list):
        blocks.extend(system)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            blocks.extend(content)
    tools = body.get("tools")
    if isinstance(tools, list):
        blocks.extend(tools)
    for block in blocks:
        if isinstance(block, Mapping):
            found.extend(block.get(name) for name in ("cache_control", "citations", "signature"))
    return found


def _refuse_request_template(call: ApiCall) -> None:
    """A chat template sent with the request decides what the model reads: it may drop,
    reorder or rewrite the screened messages, or spell new text the judge never saw (a
    Jinja expression, not its result, is what a screen of its text would read). vLLM
    0.10.2 renders one unconditionally (``serving_chat.py``); 0.11.0, top-level or as
    ``chat_template_kwargs``'s ``chat_template``, only with
    ``--trust-request-chat-template``; SGLang 0.5.3 hands ``chat_template_kwargs`` to
    the tokenizer's ``apply_chat_template`` as keyword arguments (``serving_chat.py``),
    where ``chat_template`` replaces the template and ``truncation``/``max_length``
    (or ``tokenizer_kwargs``) cut the prompt after screening. A guarded model refuses
    them all on any engine; other template variables are screened as text."""
    if call.body.get("chat_template") is not None:
        raise _template_refusal(call, "chat_template", "chat_template")
    kwargs = call.body.get("chat_template_kwargs")
    if not isinstance(kwargs, Mapping):
        return
    for name in _TEMPLATE_CHANGING_KWARGS:
        if kwargs.get(name) is not None and kwargs.get(name) is not False:
            raise _template_refusal(call, "chat_template_kwargs", f"chat_template_kwargs.{name}")


def _template_refusal(call: ApiCall, param: str, shown: str) -> ApiError:
    return errors.bad_request(
        f"The model `{call.model}` screens requests with a guard policy, and `{shown}` could "
        "change the prompt the model reads after screening (a chat template, or a cut of the "
        f"prompt): leave out `{shown}`; the model's own template is used.",
        param=param,
    )


def _merged(turns: Iterable[Turn]) -> list[Turn]:
    """Empty turns dropped, neighbours of one role joined, the first one the user's.
    Each run of one role is joined once, at its end: linear in the text, where joining
    turn by turn copied the run so far each time (200,000 one-letter turns held the
    event loop seconds)."""
    merged: list[Turn] = []
    role = ""
    texts: list[str] = []
    images: list[Mapping[str, object]] = []

    def close_run() -> None:
        if texts or images:
            merged.append(Turn(role, "\n\n".join(texts), tuple(images)))

    for turn in turns:
        if not turn.text and not turn.images:
            continue
        turn_role = turn.role if merged or texts or images else "user"
        if turn_role != role:
            close_run()
            role, texts, images = turn_role, [], []
        if turn.text:
            texts.append(turn.text)
        images.extend(turn.images)
    close_run()
    return merged


def _as_messages(turns: Sequence[Turn]) -> list[dict[str, object]]:
    return [{"role": t.role, "content": t.content()} for t in turns]


def split_in_two(turns: Sequence[Turn]) -> tuple[list[Turn], list[Turn]] | None:
    """Two smaller pieces of a conversation its judge could not read whole, or None
    when it cannot be made smaller. Several turns are cut at the middle of their text
    with an overlap (``_cut_with_overlap``), or between turns when their text is short;
    one turn: its images apart from its text, then the images in halves; else the text
    in halves that overlap by a sixteenth of it on each side of a cut at the space
    nearest the middle, so that words at the cut are read whole in one piece. Each
    piece's text is at most five eighths of the whole's."""
    if len(turns) > 1:
        if sum(len(turn.text) for turn in turns) >= _MIN_SPLIT_CHARS:
            return _cut_with_overlap(turns)
        middle = len(turns) // 2
        return _merged(turns[:middle]), _merged(turns[middle:])
    if not turns:
        return None
    [turn] = turns
    if turn.images and turn.text:
        return [Turn(turn.role, "", turn.images)], [Turn(turn.role, turn.text)]
    if len(turn.images) > 1:
        middle = len(turn.images) // 2
        return [Turn(turn.role, "", turn.images[:middle])], [Turn(turn.role, "", turn.images[middle:])]
    text = turn.text
    if turn.images or len(text) < _MIN_SPLIT_CHARS:
        return None
    cut, overlap = _cut_point(text)
    return [Turn(turn.role, text[: cut + overlap])], [Turn(turn.role, text[cut - overlap :])]


def _cut_point(text: str) -> tuple[int, int]:
    """Where ``text`` is cut in two (the space nearest its middle, within a sixteenth of it)
    and how far each piece reaches past the cut (that sixteenth)."""
    overlap = len(text) // 16
    middle = len(text) // 2
    before = text.rfind(" ", middle - overlap, middle + 1)
    after = text.find(" ", middle, middle + overlap)
    spaces = [space for space in (before, after) if space > 0]
    return (min(spaces, key=lambda space: abs(space - middle)) if spaces else middle), overlap


def _cut_with_overlap(turns: Sequence[Turn]) -> tuple[list[Turn], list[Turn]]:
    """Several turns cut in two at the middle of their text (at the space nearest it),
    the pieces overlapping by a sixteenth of the text on each side of the cut, whether
    the cut falls inside a turn or between two: words on either side of a turn's
    boundary are read together in one piece, as the whole conversation read them.
    A turn cut in two keeps its images in its first part."""
    starts: list[int] = []
    offset = 0
    for turn in turns:
        starts.append(offset)
        offset += len(turn.text)
    text = "".join(turn.text for turn in turns)
    cut, overlap = _cut_point(text)
    end, begin = cut + overlap, cut - overlap
    first: list[Turn] = []
    second: list[Turn] = []
    for turn, start in zip(turns, starts, strict=True):
        stop = start + len(turn.text)
        if start < end or (start == end and not turn.text):
            first.append(Turn(turn.role, turn.text[: end - start], turn.images))
        if stop > begin:
            second.append(
                Turn(turn.role, turn.text[max(0, begin - start) :], () if start < begin else turn.images)
            )
    return _merged(first), _merged(second)


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of the conversation the judge reads."""

    role: str
    text: str
    images: tuple[Mapping[str, object], ...] = ()

    def content(self) -> object:
        if not self.images:
            return self.text
        text = [{"type": "text", "text": self.text}] if self.text else []
        return [*text, *({"type": "image_url", "image_url": image} for image in self.images)]


def _message_turn(
    message: Mapping[str, object], model: str, images: bool
) -> tuple[str, tuple[Mapping[str, object], ...]]:
    """A message's text (its content, and every other field of it that templates
    render: the model reads those too) and its images."""
    text, found = _content(message.get("content"), model, images)
    role = message.get("role")
    parts = [role] if isinstance(role, str) and role not in _KNOWN_ROLES else []
    parts.append(text)
    parts.extend(_strings([message.get(name) for name in _RENDERED_MESSAGE_FIELDS]))
    calls = message.get("tool_calls")
    for tool_call in calls if isinstance(calls, list) else []:
        if not isinstance(tool_call, Mapping):
            continue
        parts.extend(_strings(tool_call.get("id")))
        function = tool_call.get("function")
        if isinstance(function, Mapping):
            # Templates write the name and the arguments (Llama 3.1 and Qwen2.5 as
            # JSON, a parsed object's keys included).
            parts.extend(_strings([function.get("name"), function.get("arguments")]))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        parts.extend(_strings([legacy.get("name"), legacy.get("arguments")]))
    return "\n".join(part for part in parts if part), found


def _content(content: object, model: str, images: bool) -> tuple[str, tuple[Mapping[str, object], ...]]:
    """A message content's text and image parts; raises the 400 for a part the judge cannot read."""
    if isinstance(content, str):
        return content, ()
    if content is None:
        return "", ()
    if not isinstance(content, list):  # an engine that reads it some other way must not get it unscreened
        raise errors.bad_request(
            f"The model `{model}` screens requests with a guard policy: a message's content must be "
            "text or a list of content parts.",
            param="messages",
        )
    texts: list[str] = []
    found: list[Mapping[str, object]] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if isinstance(part, Mapping) and kind in ("text", None) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, Mapping) and kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])  # an earlier assistant turn's refusal, as text
        elif (
            images
            and isinstance(part, Mapping)
            and kind == "image_url"
            and isinstance(part.get("image_url"), Mapping)
        ):
            found.append(part["image_url"])
        else:
            shown = kind[:40] if isinstance(kind, str) else type(part).__name__
            reads = "text and images" if images else "text"
            raise errors.bad_request(
                f"The model `{model}` screens requests with a guard policy whose judge reads {reads}: "
                f"it cannot screen a `{shown}` content part, so the request is refused.",
                param="messages",
            )
    return "\n".join(texts), tuple(found)


def _strings(value: object) -> list[str]:
    """Every string in a JSON value, object keys included (a parameter's name is text
    the model reads too), in document order. Linear in the value: one list is filled,
    not a list per level copied into its parent's (the door bounds the depth:
    ``calls.json_object``)."""
    found: list[str] = []
    _collect_strings(value, found)
    return found


def _collect_strings(value: object, found: list[str]) -> None:
    if isinstance(value, str):
        if value:
            found.append(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _collect_strings(key, found)
            _collect_strings(item, found)
    elif isinstance(value, list):
        for item in value:
            _collect_strings(item, found)


def _answer_text(body: bytes) -> str:
    try:
        data = json.loads(body)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


def says_too_long(status: int, body: bytes) -> bool:
    """Whether an engine's error answer says the prompt is longer than its context
    (413, or a 400 in vLLM's, SGLang's, llama.cpp's or OpenAI's words)."""
    if status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
        return True
    if status != HTTPStatus.BAD_REQUEST:
        return False
    error = _engine_error(body)
    message = error.get("message")
    text = message.lower() if isinstance(message, str) else ""
    marks = {str(error.get("code")), str(error.get("type"))}
    return bool(marks & _TOO_LONG_CODES) or any(words in text for words in _TOO_LONG_WORDS)


def _engine_error(body: bytes) -> Mapping[str, object]:
    """The fields of an engine's error body: ``{"error": {...}}``, or at the top (older vLLM)."""
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    error = data.get("error")
    return error if isinstance(error, dict) else data


class _Reading(StrEnum):
    """What one judge call came to (the ``verdict`` label of the latency metric)."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    UNREADABLE = "unreadable"
    REFUSED = "refused"  # the judge answered 4xx: it would not read what the client sent
    TOO_LONG = "too_long"  # ... because it is longer than the judge's context
    ERROR = "error"  # the judge did not answer: no replica, a timeout, its 5xx


@dataclass(frozen=True, slots=True)
class _Judged:
    reading: _Reading
    categories: tuple[str, ...] = ()
    detail: str = ""  # for the log
    judge_refusal: routing.Refusal | None = None  # the router's own answer for the judge


class Guard:
    def __init__(self, settings: RouterSettings, dispatcher: Dispatcher, metrics: RouterMetrics) -> None:
        self._settings = settings
        self._dispatcher = dispatcher
        self._metrics = metrics

    async def screen(self, call: ApiCall, chain: Iterable[str], catalog: Catalog, request_id: str) -> ApiCall:
        """The call to send on when every applicable policy lets it through (a screened
        call without the client's raw bytes: the engine gets what the judge read);
        raises the refusal otherwise."""
        if call.api is routing.Api.EMBEDDINGS:
            return call  # embeddings produce no text to misuse; their inputs are not screened
        policies = policies_for(catalog, chain)
        if policies and call.size > self._settings.guard_max_body_bytes:
            raise ApiError(errors.guarded_body_too_large(call.model, self._settings.guard_max_body_bytes))
        for name, policy in policies:
            await self._screen_one(call, name, policy, catalog, request_id)
        return replace(call, raw=None) if policies else call

    async def _screen_one(
        self, call: ApiCall, name: str, policy: GuardPolicy, catalog: Catalog, request_id: str
    ) -> None:
        """Returns when the policy lets the call through; raises its refusal otherwise.
        Under ``on_too_long: split`` a conversation the judge finds too long is judged
        again in two pieces, and so on, each piece within ``guard_max_pieces`` calls."""
        if call.size > _SCREEN_ON_LOOP_BYTES:
            # Reading a large body's every turn is CPU the loop must not spend in one go:
            # in a worker thread, the interpreter switches back to the loop every few
            # milliseconds (sys.getswitchinterval), so /health and the streams of
            # others go on. The body is this request's alone and nobody changes it
            # while the handler waits here.
            turns = await asyncio.to_thread(_judge_turns, call, policy.judge_reads_images)
        else:
            turns = _judge_turns(call, policy.judge_reads_images)
        if not turns:
            return  # the client wrote no text at all
        judge = catalog.resolve(policy.judge)
        pieces = deque([turns])
        asked = 0
        while pieces:
            piece = pieces.popleft()
            asked += 1
            judged = await self._ask(name, policy, judge, piece, catalog, request_id)
            if judged.reading is _Reading.TOO_LONG and policy.on_too_long is GuardTooLongPolicy.SPLIT:
                halves = split_in_two(piece)
                if halves is not None and asked + len(pieces) + 2 <= self._settings.guard_max_pieces:
                    pieces.extendleft(reversed(halves))
                    continue
            if judged.reading is not _Reading.SAFE:
                self._settle(call.model, name, policy, judged)

    async def _ask(
        self,
        name: str,
        policy: GuardPolicy,
        judge: str | None,
        turns: Sequence[Turn],
        catalog: Catalog,
        request_id: str,
    ) -> _Judged:
        """One judge call, read."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        body: dict[str, object] = {
            "messages": _as_messages(turns),
            "max_tokens": self._settings.guard_max_tokens,
            "temperature": 0,
            "stream": False,
        }
        judged: _Judged
        try:
            if judge is None:
                raise ApiError(routing.model_not_found(policy.judge))
            async with asyncio.timeout(self._settings.guard_timeout):
                answer = await self._dispatcher.complete(judge, catalog, body, request_id)
        except ApiError as exc:  # the router's own refusal: no replica, a failed connection...
            judged = _Judged(_Reading.ERROR, detail=exc.refusal.message, judge_refusal=exc.refusal)
        except TimeoutError:
            judged = _Judged(_Reading.ERROR, detail="timed out")
        else:
            if answer.status == HTTPStatus.OK:
                verdict = parse_verdict(_answer_text(answer.body))
                if verdict.safe:
                    judged = _Judged(_Reading.SAFE)
                else:
                    reading = _Reading.UNSAFE if verdict.readable else _Reading.UNREADABLE
                    judged = _Judged(reading, verdict.categories)
            elif answer.status >= HTTPStatus.INTERNAL_SERVER_ERROR:
                judged = _Judged(_Reading.ERROR, detail=f"the judge answered HTTP {answer.status}")
            else:
                # Its message stays out of the log: an engine's validation error may quote the input.
                reading = _Reading.TOO_LONG if says_too_long(answer.status, answer.body) else _Reading.REFUSED
                judged = _Judged(reading, detail=f"the judge answered HTTP {answer.status}")
        self._metrics.guard_latency.labels(name, str(judged.reading)).observe(loop.time() - started)
        return judged

    def _settle(self, model: str, name: str, policy: GuardPolicy, judged: _Judged) -> None:
        """Raises the refusal a judge call that was not ``safe`` means, or returns for
        a judge that did not answer under ``on_error: allow``."""
        reading = judged.reading
        if reading is _Reading.ERROR:
            if policy.on_error is GuardErrorPolicy.ALLOW:
                log.warning(
                    "guard %s: judge unavailable (%s); letting the request through (on_error: allow)",
                    name,
                    judged.detail,
                )
                return
            log.warning(
                "guard %s: judge unavailable (%s); blocking the request (on_error: block)",
                name,
                judged.detail,
            )
            raise errors.guard_unavailable(model, judged.judge_refusal)
        if reading is _Reading.TOO_LONG:
            log.info(
                "guard %s: blocked a request for %s: longer than its judge reads (%s; on_too_long: %s)",
                name, model, judged.detail, policy.on_too_long,
            )  # fmt: skip
            raise errors.too_long_to_screen(model)
        if reading is _Reading.REFUSED:
            # Not an outage: the client chose what the judge would not read.
            log.warning(
                "guard %s: blocked a request for %s: its judge refused it (%s)", name, model, judged.detail
            )
            raise errors.screen_refused()
        log.info("guard %s: blocked a request for %s (%s)", name, model, reading)
        raise errors.content_policy(judged.categories)
