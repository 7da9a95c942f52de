"""What each engine needs to run one replica: the argv of every rank, its health path, its ports.

Owns the engine-specific knowledge (vLLM's and SGLang's flags, llama.cpp's,
the simulator's), as pure functions from a profile and a ``LaunchContext`` to a
``Launch``. The Nomad templates arrange the job (groups, tasks, services,
devices); they take commands from here, so the flags llmgw sets are decided in
one tested place, and the security policy's ``owned`` lists can be checked
against them.

Values that only the Nomad client knows at run time (ports, addresses) are
``Runtime`` strings such as ``${NOMAD_PORT_http}``: the renderer writes them
unescaped, while every catalog value is escaped.
"""

from __future__ import annotations

from dataclasses import replace

from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.engines.base import (
    Launch,
    LaunchContext,
    ModelFiles,
    RankLaunch,
    Runtime,
    Step,
    Word,
)
from llmgw.core.engines.llamacpp import launch_llamacpp
from llmgw.core.engines.sglang import launch_sglang
from llmgw.core.engines.sim import launch_sim
from llmgw.core.engines.vllm import launch_vllm

__all__ = [
    "Launch",
    "LaunchContext",
    "ModelFiles",
    "RankLaunch",
    "Runtime",
    "Step",
    "Word",
    "launch",
]


def launch(profile: Profile, context: LaunchContext) -> Launch:
    """The ranks of one replica of ``profile``, each with its commands."""
    match profile.engine:
        case Engine.VLLM:
            launched = launch_vllm(profile, context)
        case Engine.SGLANG:
            launched = launch_sglang(profile, context)
        case Engine.LLAMACPP:
            launched = launch_llamacpp(profile, context)
        case Engine.SIM:
            launched = launch_sim(profile, context)
    return with_api_key(launched, context.api_key)


def with_api_key(launched: Launch, api_key: Runtime | None) -> Launch:
    """Rank 0's engine (the one serving the API) with ``--api-key``, last on its command line.

    The same flag on every engine at the pinned releases: vLLM's ``--api-key`` (guards
    /v1/* only), SGLang's ``--api-key`` (every path but /health* and /metrics*) and
    llama-server's ``--api-key`` (every path but /health, /v1/health, /models, /v1/models,
    /api/tags and /). The security policy refuses it in a catalog's args.
    """
    if api_key is None:
        return launched
    ranks = tuple(
        replace(rank, serve=replace(rank.serve, argv=(*rank.serve.argv, "--api-key", api_key)))
        if rank.serves_api
        else rank
        for rank in launched.ranks
    )
    return replace(launched, ranks=ranks)
