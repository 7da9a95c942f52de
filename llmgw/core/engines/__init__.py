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
from llmgw.core.engines import llamacpp, sglang, sim, vllm
from llmgw.core.engines.base import (
    KeyFromConfigFile,
    KeyFromEnv,
    KeyIntake,
    Launch,
    LaunchContext,
    LoggingConfigFile,
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
    "KeyFromConfigFile",
    "KeyFromEnv",
    "KeyIntake",
    "Launch",
    "LaunchContext",
    "LoggingConfigFile",
    "ModelFiles",
    "RankLaunch",
    "Runtime",
    "Step",
    "Word",
    "launch",
]


def launch(profile: Profile, context: LaunchContext) -> Launch:
    """The ranks of one replica of ``profile``, each with its commands."""
    intake: KeyIntake
    key_logging: LoggingConfigFile | None = None
    match profile.engine:
        case Engine.VLLM:
            launched, intake = launch_vllm(profile, context), vllm.KEY_INTAKE
        case Engine.SGLANG:
            launched, intake = launch_sglang(profile, context), sglang.KEY_INTAKE
            key_logging = sglang.key_logging(profile)
        case Engine.LLAMACPP:
            launched, intake = launch_llamacpp(profile, context), llamacpp.KEY_INTAKE
        case Engine.SIM:
            launched, intake = launch_sim(profile, context), sim.KEY_INTAKE
    return with_api_key(launched, intake, key_logging) if context.requires_api_key else launched


def with_api_key(launched: Launch, intake: KeyIntake, key_logging: LoggingConfigFile | None = None) -> Launch:
    """The replica with rank 0's engine (the one serving the API) requiring a key it reads
    as ``intake`` says: never ``--api-key <key>``, which any user of the node sees in
    /proc/PID/cmdline. A config file's path is the one word added, last on the line.

    What the key guards at the pinned releases: vLLM's /v1/* only, SGLang's every path but
    /health* and /metrics*, llama-server's every path but /health, /v1/health, /models,
    /v1/models, /api/tags and /. The security policy refuses the key's flags and variables
    in a catalog. ``key_logging``: the logging config that keeps the key out of rank 0's
    logs, for an engine that would log it (SGLang); its path goes in rank 0's env.
    """
    if isinstance(intake, KeyFromConfigFile):
        ranks = tuple(
            replace(rank, serve=replace(rank.serve, argv=(*rank.serve.argv, intake.flag, intake.path)))
            if rank.serves_api
            else rank
            for rank in launched.ranks
        )
        launched = replace(launched, ranks=ranks)
    if key_logging is not None:
        # Only rank 0's engine holds the key, so only its logs need the config.
        setting = (key_logging.variable, key_logging.path)
        ranks = tuple(
            replace(rank, serve=replace(rank.serve, env=(*rank.serve.env, setting)))
            if rank.serves_api
            else rank
            for rank in launched.ranks
        )
        launched = replace(launched, ranks=ranks, key_logging=key_logging)
    return replace(launched, key_intake=intake)
