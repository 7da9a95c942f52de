"""llama.cpp: ``llama-server`` on one node, splitting layers across that node's GPUs."""

from __future__ import annotations

from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.catalog.roles import role_args
from llmgw.core.engines.base import Launch, LaunchContext, RankLaunch, Step, Word, port

HEALTH_PATH = "/health"


def launch_llamacpp(profile: Profile, context: LaunchContext) -> Launch:
    argv: tuple[Word, ...] = (
        "/app/llama-server",
        "--model",
        context.model.engine_arg,
        "--host",
        context.container_listen_host,
        "--port",
        port("http"),
        "--alias",
        context.served_name,
        # /slots shows every slot's prompt to any client by default.
        "--no-slots",
        *role_args(Engine.LLAMACPP, context.roles),
        *profile.args,
    )
    rank = RankLaunch(0, Step("engine", argv), ports=("http",))
    return Launch(Engine.LLAMACPP, (rank,), HEALTH_PATH, containerised=True)
