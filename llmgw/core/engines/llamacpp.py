"""llama.cpp: ``llama-server`` on one node, splitting layers across that node's GPUs."""

from __future__ import annotations

from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.catalog.roles import role_args
from llmgw.core.catalog.tool_calling import tool_call_args
from llmgw.core.engines.base import KeyFromEnv, Launch, LaunchContext, RankLaunch, Step, Word, port

HEALTH_PATH = "/health"
# llama-server takes --api-key from LLAMA_API_KEY when the flag is absent (common/arg.cpp:
# ``.set_env("LLAMA_API_KEY")`` on --api-key, read by ``common_params_parse_ex``; both
# commits that bracket b6700, and the e2e's real llama-server).
KEY_INTAKE = KeyFromEnv("LLAMA_API_KEY")
SERVER = "/app/llama-server"

# A mirror version's GGUF is known only on the node (its manifest): read its path from the
# file the fetch step wrote, then become llama-server. llmgw's own text; every other word
# stays its own argv word ("$@"), never parsed by the shell.
LOAD_GGUF_NAMED_IN_FILE = 'model="$(cat "$1")" && shift && exec "$@" --model "$model"'


def launch_llamacpp(profile: Profile, context: LaunchContext) -> Launch:
    path_file = context.model.path_file
    model: tuple[Word, ...] = ("--model", context.model.engine_arg) if path_file is None else ()
    server: tuple[Word, ...] = (
        (SERVER,)
        if path_file is None
        else ("/bin/sh", "-c", LOAD_GGUF_NAMED_IN_FILE, "llama-server", path_file, SERVER)
    )
    argv: tuple[Word, ...] = (
        *server,
        *model,
        "--host",
        context.container_listen_host,
        "--port",
        port("http"),
        "--alias",
        context.served_name,
        # /slots shows every slot's prompt to any client by default.
        "--no-slots",
        *role_args(Engine.LLAMACPP, context.roles),
        *tool_call_args(profile, context.roles, context.release),
        *profile.args,
    )
    rank = RankLaunch(0, Step("engine", argv), ports=("http",))
    return Launch(Engine.LLAMACPP, (rank,), HEALTH_PATH, containerised=True)
