"""What each engine release takes in the chat completion fields a translation sets that
not every release takes alike: ``reasoning_effort``'s words and ``parallel_tool_calls``.

Owns: the table of those facts per engine release (``CHAT_FIELDS``, read from each
vLLM and SGLang release's own request model, vendored in
``llmgw/apispec/engines/requests/``: the tests hold the table to those schemas; and
from llama-server's source for llama.cpp), the facts of a release between or beyond
the table's (``fields_of``), and a translated chat body shaped for the releases one
model runs (``shaped_for``): the client's effort as the nearest word every one of them
takes, ``parallel_tool_calls`` left out where a release has no such field.

A translation writes the word every supported release takes (``SAFE_EFFORTS``) in the
body it builds for the whole chain, so a body not shaped is still one every engine
takes; ``shaped_for`` then gives each model what the client asked where its releases
take it.

Must not: read files or settings (the releases come in as values).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from llmgw.core.catalog.images import Release, image_release
from llmgw.core.catalog.model import Engine, Profile

# The effort words in increasing order: OpenAI's (Responses ``reasoning.effort``, chat
# ``reasoning_effort``: none to xhigh) and Anthropic's ``max`` (``output_config.effort``).
SCALE = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# What every supported release takes (vLLM 0.11.0's and SGLang 0.5.3's ``Literal``).
SAFE_EFFORTS = frozenset({"low", "medium", "high"})
_ALL_EFFORTS = frozenset(SCALE)


@dataclass(frozen=True, slots=True)
class ChatFields:
    """What one release takes: the effort words, and whether it has ``parallel_tool_calls``."""

    efforts: frozenset[str]
    parallel_tool_calls: bool


_SAFE = ChatFields(SAFE_EFFORTS, parallel_tool_calls=False)

# (engine) -> release as ``Release.__str__`` shows it -> its facts.
CHAT_FIELDS: Mapping[Engine, Mapping[str, ChatFields]] = MappingProxyType(
    {
        # ``reasoning_effort: Literal["low", "medium", "high"]`` (vllm/entrypoints/openai/
        # protocol.py, 0.11.0); ``ReasoningEffort`` (vllm/renderers/params.py, 0.34.0).
        Engine.VLLM: MappingProxyType(
            {
                "0.11.0": ChatFields(SAFE_EFFORTS, parallel_tool_calls=True),
                "0.34.0": ChatFields(_ALL_EFFORTS, parallel_tool_calls=True),
            }
        ),
        # 0.5.3: the three words, and no ``parallel_tool_calls`` (its ChatCompletionRequest
        # drops it, extra="ignore"); 0.5.23: ``ReasoningEffortTier`` (and ``ultra``, a
        # number), and ``parallel_tool_calls`` (sglang/srt/entrypoints/openai/protocol.py).
        Engine.SGLANG: MappingProxyType(
            {
                "0.5.3": ChatFields(SAFE_EFFORTS, parallel_tool_calls=False),
                "0.5.23": ChatFields(_ALL_EFFORTS, parallel_tool_calls=True),
            }
        ),
        # llama-server b11434 reads any word ("none": reasoning off, any other into the
        # template's reasoning_effort: tools/server/server-common.cpp) and
        # parallel_tool_calls (the same file); older builds were not read: the floor.
        Engine.LLAMACPP: MappingProxyType({"b11434": ChatFields(_ALL_EFFORTS, parallel_tool_calls=True)}),
        # llmgw's own simulator ignores both.
        Engine.SIM: MappingProxyType({"sim": ChatFields(_ALL_EFFORTS, parallel_tool_calls=True)}),
    }
)


def _numbers(name: str) -> tuple[int, ...]:
    numbers = tuple(int(part) for part in re.findall(r"\d+", name))
    return numbers + (0,) * (4 - len(numbers))


def fields_of(engine: Engine, release: Release | None) -> ChatFields:
    """The facts of ``release`` of ``engine``: its own; for one between two of the
    table's what both take; for one newer than every row the newest's. The floor
    (``SAFE_EFFORTS``, no ``parallel_tool_calls``) for a release unknown (an image
    pinned by digest) or older than every row. The simulator has one row, whatever."""
    table = CHAT_FIELDS.get(engine, {})
    if engine is Engine.SIM:
        return table["sim"]
    if release is None:
        return _SAFE
    wanted = release.numbers + (0,) * (4 - len(release.numbers))
    rows = sorted(table.items(), key=lambda row: _numbers(row[0]))
    for name, facts in rows:
        if _numbers(name) == wanted:
            return facts
    below = [facts for name, facts in rows if _numbers(name) < wanted]
    above = [facts for name, facts in rows if _numbers(name) > wanted]
    if not below:
        return _SAFE
    if not above:
        return below[-1]
    return ChatFields(
        below[-1].efforts & above[0].efforts,
        below[-1].parallel_tool_calls and above[0].parallel_tool_calls,
    )


def model_fields(profiles: Sequence[Profile], default_images: Mapping[Engine, str]) -> tuple[ChatFields, ...]:
    """The facts of the release each of a model's profiles runs: its ``image``'s, or the
    engine's default image's (the operator's ``LLMGW_IMAGE_*``, as the renderer reads them)."""
    found = []
    for profile in profiles:
        image = profile.image or default_images.get(profile.engine)
        release = None if image is None else image_release(profile.engine, image)
        found.append(fields_of(profile.engine, release))
    return tuple(found)


def nearest_effort(asked: str, takes: frozenset[str]) -> str | None:
    """``asked`` when every release takes it, else the nearest word on ``SCALE`` they
    take (the lower one of two as near); None for a word not on the scale."""
    if asked not in SCALE:
        return None
    if asked in takes:
        return asked
    at = SCALE.index(asked)
    candidates = sorted(
        (abs(SCALE.index(word) - at), SCALE.index(word), word) for word in takes if word in SCALE
    )
    return candidates[0][2] if candidates else None


def shaped_for(
    chat: Mapping[str, object], releases: Sequence[ChatFields], asked_effort: str | None
) -> dict[str, object]:
    """``chat`` (a translation's body for the whole chain) for a model whose profiles run
    ``releases``: the client's effort word (``asked_effort``, on ``SCALE``) as the
    nearest every one takes, and ``parallel_tool_calls`` left out where one has no such
    field (it would drop it)."""
    shaped = dict(chat)
    if not releases:
        return shaped
    if asked_effort is not None and "reasoning_effort" in shaped:
        takes = frozenset.intersection(*(release.efforts for release in releases))
        effort = nearest_effort(asked_effort, takes)
        if effort is not None:
            shaped["reasoning_effort"] = effort
    if "parallel_tool_calls" in shaped and not all(release.parallel_tool_calls for release in releases):
        del shaped["parallel_tool_calls"]
    return shaped
