"""SGLang: ``python3 -m sglang.launch_server`` on every node with its rank.

Across nodes every rank runs the same server command with ``--nnodes``,
``--node-rank`` and ``--dist-init-addr`` (rank 0's rendezvous address); only
rank 0 serves HTTP. Ranks block in torch's rendezvous until all have joined,
so workers only need rank 0's address before they start.

Every port a rank listens on is one Nomad allocated. Rank 0's API is ``http``.
A worker rank, once its schedulers are ready, starts a stand-in health server on
its own ``--host``/``--port`` (``launch_dummy_health_check_server`` from
``_launch_subprocesses``, ``python/sglang/srt/entrypoints/engine.py`` in 0.5.3),
by default ``127.0.0.1:30000``: a port in Nomad's dynamic range that Nomad never
gave it. So each worker gets its own ``health`` port, on loopback (nothing
routes to it). A one-node replica's torch.distributed store listens on
``--nccl-port`` (``tcp://127.0.0.1:<nccl_port>``, ``model_runner.py``; unset, a
free port probed at ``--port`` + 100..1000, ``PortArgs.init_new`` in
``server_args.py``), so it gets a ``nccl`` port too, except with data parallel:
each data parallel rank binds a port of its own from ``PortArgs.init_new``
(``launch_dp_schedulers``), and one fixed port would be bound twice. Across
nodes the store is rank 0's ``--dist-init-addr`` (the ``dist`` port).

``/health`` (the same handler as ``/health_generate`` in 0.5.3,
``entrypoints/http_server.py``) sends a one-token generation and then polls once
a second, for up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds (20 by default), for
any output of the scheduler; only then does it answer 503. A healthy engine busy
with a long prefill answers after a few seconds, never under one. The check's
timeout covers the engine's own verdict (``health_answer_within_s``), so a busy
replica is not marked critical by a timeout. ``/get_model_info`` would answer at
once but says nothing of the scheduler and answers 200 while the server is still
warming up and while it shuts down, where ``/health`` answers 503.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.catalog.roles import role_args
from llmgw.core.catalog.tool_calling import tool_call_args
from llmgw.core.engines.base import (
    HeadAddress,
    KeyFromConfigFile,
    Launch,
    LaunchContext,
    LoggingConfigFile,
    RankLaunch,
    Step,
    Word,
    address,
    env_ref,
    numbers,
    port,
)

HEALTH_PATH = "/health"
# SGLang 0.5.3 reads --api-key from argv only (no variable: server_args.py), but
# ``prepare_server_args`` reads more options from ``--config FILE.yaml``
# (server_args_config_parser.py, ``ConfigArgumentMerger``) in the same process, so only
# the file's path is on the command line. The file is in the task's secrets directory.
KEY_INTAKE = KeyFromConfigFile(flag="--config", item="api-key", file_name="engine-key.yaml")

# SGLang 0.5.3 logs ``server_args=ServerArgs(..., api_key='<key>', ...)`` once at start
# (``_launch_subprocesses``, srt/entrypoints/engine.py), however the key came. Every
# SGLang process calls ``configure_logger`` (srt/utils/common.py), which loads
# ``SGLANG_LOGGING_CONFIG_PATH`` with ``logging.config.dictConfig`` instead of its
# ``basicConfig``; the config below is that basicConfig (format, date format, stderr,
# the --log-level) with that logger raised to WARNING: its only INFO record is the
# dump (the rest are DEBUG, and ERROR when a scheduler dies, which still shows).
LOGGING_CONFIG_ENV = "SGLANG_LOGGING_CONFIG_PATH"
LOGGING_CONFIG_FILE = "sglang-logging.json"
ARGS_LOGGER = "sglang.srt.entrypoints.engine"
# configure_logger's own format without its per-process prefix (" TP1" and the like,
# which a file shared by every process cannot vary).
LOG_FORMAT = "[%(asctime)s] %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
# --log-level's default (ServerArgs.log_level) and the names logging knows it by.
DEFAULT_LOG_LEVEL = "info"
_LOG_LEVELS = frozenset({"debug", "info", "warning", "error", "critical"})

# SGLang's /health gives up and answers 503 after this many seconds without output
# from the scheduler (http_server.py: int(os.getenv(..., 20)) in 0.5.3).
HEALTH_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
ENGINE_HEALTH_TIMEOUT_S = 20
# Its polls are a second apart: the verdict can come one poll late, then travel back.
HEALTH_VERDICT_SLACK_S = 2
# Where a worker rank's stand-in health server listens: its own Nomad port, loopback only.
WORKER_HEALTH_PORT = "health"
WORKER_HEALTH_HOST = "127.0.0.1"
# Where a one-node replica's torch.distributed store listens (127.0.0.1:--nccl-port).
NCCL_PORT = "nccl"
_DATA_PARALLEL_FLAGS = ("--dp-size", "--data-parallel-size")


def _data_parallel(args: tuple[str, ...]) -> bool:
    """Whether the profile's args set SGLang's data parallel size (any spelling argparse
    takes: ``--dp-size 2``, ``--dp-size=2``, an unambiguous prefix such as ``--dp``)."""
    for word in args:
        name = word.split("=", 1)[0]
        if len(name) > 3 and any(flag.startswith(name) for flag in _DATA_PARALLEL_FLAGS):
            return True
    return False


def _log_level(args: tuple[str, ...]) -> str:
    """The profile's ``--log-level`` (last one wins, as argparse), else SGLang's default."""
    level = DEFAULT_LOG_LEVEL
    for index, word in enumerate(args):
        if word == "--log-level" and index + 1 < len(args):
            level = args[index + 1]
        elif word.startswith("--log-level="):
            level = word.split("=", 1)[1]
    # configure_logger takes getattr(logging, level.upper()); a name it would not find
    # stops SGLang's basicConfig, and here keeps the default rather than fail dictConfig.
    return level.lower() if level.lower() in _LOG_LEVELS else DEFAULT_LOG_LEVEL


def logging_config(args: tuple[str, ...]) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` SGLang loads instead of its own basicConfig."""
    return {
        "version": 1,
        # SGLang's modules make their loggers at import, before configure_logger runs.
        "disable_existing_loggers": False,
        "formatters": {"sglang": {"format": LOG_FORMAT, "datefmt": LOG_DATE_FORMAT}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "sglang", "stream": "ext://sys.stderr"}
        },
        "root": {"level": _log_level(args).upper(), "handlers": ["stderr"]},
        "loggers": {ARGS_LOGGER: {"level": "WARNING"}},
    }


def key_logging(profile: Profile) -> LoggingConfigFile:
    """The logging config that keeps rank 0's API key out of the task's logs."""
    text = json.dumps(logging_config(profile.args), indent=2, sort_keys=True) + "\n"
    return LoggingConfigFile(variable=LOGGING_CONFIG_ENV, file_name=LOGGING_CONFIG_FILE, text=text)


def health_answer_within_s(profile: Profile) -> int:
    """How long a healthy engine may take to answer /health, under the profile's env."""
    raw = profile.env.get(HEALTH_TIMEOUT_ENV)
    try:
        # The engine reads it with int(); a value int() refuses stops the engine at import.
        engine_timeout = ENGINE_HEALTH_TIMEOUT_S if raw is None else max(int(raw), 0)
    except ValueError:
        engine_timeout = ENGINE_HEALTH_TIMEOUT_S
    return engine_timeout + HEALTH_VERDICT_SLACK_S


def dist_timeout_args(profile: Profile, context: LaunchContext) -> tuple[str, ...]:
    """``--dist-timeout`` for a replica across nodes: as long as the control plane waits.

    Unset (``dist_timeout: None``, ``srt/arg_groups/fields/parallel.py`` in 0.5.23,
    ``server_args.py`` in 0.5.3), ``init_distributed_environment`` passes no timeout to
    ``torch.distributed.init_process_group``, whose default for NCCL is 10 minutes. Rank 0
    starts when its own allocation runs and then waits in torch's rendezvous for ranks whose
    nodes may still be pulling a multi-GB image (the control plane waits for them up to its
    placement timeout, 15 min by default) and at the barriers of a load the control plane
    waits for up to the profile's load timeout (30 min for SGLang, 1 h for a 405B). torch
    giving up sooner fails a replica the control plane would still wait for; longer is moot,
    as the control plane stops the replica then. So the wait is the longer of the two. A
    profile's own ``--dist-timeout`` wins (argparse takes the last, and it comes later).
    """
    if context.load_wait_s is None or any(
        word == "--dist-timeout" or word.startswith("--dist-timeout=") for word in profile.args
    ):
        return ()
    return ("--dist-timeout", str(context.load_wait_s))


def launch_sglang(profile: Profile, context: LaunchContext) -> Launch:
    nodes = profile.node_count
    answer_within = health_answer_within_s(profile)
    common: tuple[Word, ...] = (
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        context.model.engine_arg,
        "--served-model-name",
        context.served_name,
        "--tp-size",
        *numbers(profile.tensor_parallel),
        "--pp-size",
        *numbers(profile.pipeline_parallel),
        *role_args(Engine.SGLANG, context.roles),
        *tool_call_args(profile, context.roles, context.release),
        # usage.prompt_tokens_details.cached_tokens in each answer, which SGLang leaves out
        # without it (UsageProcessor's enable_cache_report, python/sglang/srt/entrypoints/
        # openai/serving_chat.py; in 0.5.3 and 0.5.23): the router's cached-token counts.
        "--enable-cache-report",
    )
    serve_api: tuple[Word, ...] = ("--host", context.container_listen_host, "--port", port("http"))
    if nodes == 1:
        # One node: torch's rendezvous store listens on --nccl-port (else a free port probed
        # near --port). Data parallel ranks each need their own, which SGLang probes itself.
        own_store = not _data_parallel(profile.args)
        store: tuple[Word, ...] = ("--nccl-port", port(NCCL_PORT)) if own_store else ()
        rank = RankLaunch(
            0,
            Step("engine", (*common, *serve_api, *store, *profile.args)),
            ports=("http", NCCL_PORT) if own_store else ("http",),
        )
        return Launch(
            Engine.SGLANG, (rank,), HEALTH_PATH, containerised=True, health_answer_within_s=answer_within
        )

    def distributed(rank: int, init_address: Word) -> tuple[Word, ...]:
        return (
            "--nnodes",
            *numbers(nodes),
            "--node-rank",
            *numbers(rank),
            "--dist-init-addr",
            init_address,
            *dist_timeout_args(profile, context),
        )

    head = RankLaunch(
        rank=0,
        serve=Step("engine", (*common, *serve_api, *distributed(0, address("dist")), *profile.args)),
        ports=("http", "dist"),
        rendezvous_port="dist",
        rendezvous_checked=True,
    )
    worker_health: tuple[Word, ...] = ("--host", WORKER_HEALTH_HOST, "--port", port(WORKER_HEALTH_PORT))
    workers = tuple(
        RankLaunch(
            rank=rank,
            serve=Step(
                "engine",
                (
                    *common,
                    *worker_health,
                    *distributed(rank, env_ref(context.head_address_env)),
                    *profile.args,
                ),
            ),
            ports=(WORKER_HEALTH_PORT,),
            head_address=HeadAddress.ENV,
        )
        for rank in range(1, nodes)
    )
    return Launch(
        Engine.SGLANG,
        (head, *workers),
        HEALTH_PATH,
        containerised=True,
        health_answer_within_s=answer_within,
    )
