"""What each engine must be told to serve a model's roles, and the profile args that contradict them.

Owns the one table of role flags: an engine started for embeddings serves
nothing else, and one started without its embedding flag answers no
``/v1/embeddings`` (or embeds wrongly). ``llmgw.core.engines`` appends
``role_args`` to each engine's argv; ``catalog check`` warns through
``role_contradictions``. Sources, at the pinned releases (see
``../shared/engines/*-flags.json``):

- llama.cpp: ``/v1/embeddings`` answers 501 unless ``--embeddings``
  (``tools/server/server.cpp``), and with it the completion endpoints refuse
  ("This server does not support completions. Start it without `--embeddings`").
  At b11434 ``/v1/embeddings`` still refuses without it (``server-context.cpp``:
  "This server does not support embeddings. Start it with `--embeddings`"); the
  completion refusal is gone, but an embedding server's batches are sized for one
  output per sequence (``server_output_limits``), so the roles stay apart.
- SGLang 0.5.3 and 0.5.23: ``--is-embedding`` (``server_args.py``) makes the server an embedding
  server; embedding models built on causal LMs need it, and it disables generation.
- vLLM 0.10.2, 0.11.0 and 0.34.0: ``--runner pooling`` (``vllm/config/model.py``, ``RunnerOption``);
  ``--convert auto`` then adapts a causal LM to embeddings, and a model with a pooling
  architecture or a sentence-transformers config (BAAI/bge-m3) is what ``--runner auto``
  would pick anyway, so the flag is right for both. ``--task`` is the deprecated spelling.

A model whose roles mix embedding with a generating role gets no role flag (the
engine generates, as before) and a warning: one engine process cannot do both.
Args are matched by their full spelling, ``--flag=value`` and (vLLM, SGLang)
underscores for dashes; abbreviations are not followed, since these are warnings
about intent, not a security boundary (that is ``security.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType

from llmgw.core.catalog.model import Engine, Role

EMBEDDING_ARGS: Mapping[Engine, tuple[str, ...]] = MappingProxyType(
    {
        Engine.VLLM: ("--runner", "pooling"),
        Engine.SGLANG: ("--is-embedding",),
        Engine.LLAMACPP: ("--embeddings",),
        Engine.SIM: (),  # the simulator serves every endpoint
    }
)

GENERATING_ROLES = frozenset({Role.CHAT, Role.COMPLETION, Role.GUARD})

# vLLM's --task values (deprecated in 0.10.2 and 0.11.0) and --convert values that pool.
_VLLM_POOLING_TASKS = frozenset({"embed", "embedding", "classify", "score", "reward"})
_VLLM_GENERATING_TASKS = frozenset({"generate", "transcription"})


def embeds_only(roles: Sequence[Role]) -> bool:
    """Every role is embedding: the engine can be started for embeddings alone."""
    return bool(roles) and all(role is Role.EMBEDDING for role in roles)


def role_args(engine: Engine, roles: Sequence[Role]) -> tuple[str, ...]:
    """The args llmgw adds to ``engine``'s argv so it serves ``roles``."""
    return EMBEDDING_ARGS[engine] if embeds_only(roles) else ()


def _options(engine: Engine, args: Sequence[str]) -> Iterator[tuple[int, str, str | None]]:
    """Each option of ``args``: its index, its name (normalised as the engine does), its value."""
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, equals, attached = arg.partition("=")
        if engine in (Engine.VLLM, Engine.SGLANG):
            name = "--" + name[2:].replace("_", "-")
        if equals:
            yield index, name, attached
        else:
            following = args[index + 1] if index + 1 < len(args) else None
            yield index, name, following if following is not None and not following.startswith("-") else None


def _pooling_option(engine: Engine, name: str, value: str | None) -> bool | None:
    """True: the option starts the engine for embeddings; False: for generation; None: neither."""
    if engine is Engine.LLAMACPP and name in ("--embeddings", "--embedding"):
        return True
    if engine is Engine.SGLANG and name == "--is-embedding":
        return True
    if engine is Engine.VLLM and value is not None:
        if name == "--runner":
            return True if value == "pooling" else False if value == "generate" else None
        if name == "--convert":
            return True if value in _VLLM_POOLING_TASKS else None
        if name == "--task":
            return (
                True if value in _VLLM_POOLING_TASKS else False if value in _VLLM_GENERATING_TASKS else None
            )
    return None


def role_contradictions(
    engine: Engine, roles: Sequence[Role], args: Sequence[str]
) -> Iterator[tuple[int, str]]:
    """(index into args, message) for each arg that starts the engine for another role than ``roles``."""
    generating = sorted(role.value for role in roles if role in GENERATING_ROLES)
    for index, name, value in _options(engine, args):
        pools = _pooling_option(engine, name, value)
        switch = value is None or name in ("--embeddings", "--embedding", "--is-embedding")
        spelled = name if switch else f"{name} {value}"
        if pools is True and generating:
            yield (
                index,
                f"{spelled} starts {engine} for embeddings only, but the model's roles include "
                f"{', '.join(generating)}, which need generation: remove it, or set roles: [embedding]",
            )
        elif pools is False and embeds_only(roles):
            yield (
                index,
                f"{spelled} starts {engine} for generation, but the model's only role is embedding "
                f"(llmgw adds {' '.join(EMBEDDING_ARGS[engine])} for it): remove it",
            )


def mixed_roles_problem(engine: Engine, roles: Sequence[Role]) -> str | None:
    """Why one replica cannot serve ``roles`` on ``engine``, or None."""
    if engine is Engine.SIM or Role.EMBEDDING not in roles or embeds_only(roles):
        return None
    generating = sorted(role.value for role in roles if role in GENERATING_ROLES)
    return (
        f"engine {engine} serves either embeddings ({' '.join(EMBEDDING_ARGS[engine])}) or generation, "
        f"not both: llmgw starts it for {', '.join(generating)}, so /v1/embeddings will fail; "
        "declare the embedding role on a model of its own"
    )
