"""vLLM: ``vllm serve``; across nodes, every rank a ``vllm serve`` of its own (0.34.0 on) or
a Ray cluster with the server in the head's container (0.10.2, 0.11.0).

Native multi-node (``NATIVE_MULTI_NODE``, vLLM 0.34.0 and later): ``ParallelConfig``
(``vllm/config/parallel.py``) has ``--nnodes``, ``--node-rank``, ``--master-addr`` and
``--master-port`` for the ``mp`` executor across nodes, and ``vllm serve --headless``
(``run_headless`` in ``vllm/entrypoints/cli/serve.py``) runs a node whose
``node_rank_within_dp`` is above 0 as the headless ``MultiprocExecutor`` workers of the
head's torch.distributed group at ``master_addr:master_port``. So every rank runs the
same server command with its rank; rank 0 serves the API and its ``dist`` port is the
group's store; each worker adds ``--headless`` and the head's address, which Nomad
renders from Consul (``LLMGW_HEAD_IP``, ``LLMGW_HEAD_PORT``). ``VLLM_HOST_IP`` is each
rank's node address, which rank 0's message queue advertises to the workers
(``mq_connect_ip``, ``v1/executor/multiproc_executor.py``). 0.34.0's wheel no longer
depends on Ray (0.11.0's requires ``ray[cgraph]>=2.48.0``), so the Ray recipe cannot be
counted on in its image.

Ray (0.10.2, 0.11.0, and an image pinned by digest, whose release llmgw cannot read):
neither has ``--nnodes``/``--node-rank``: multi-node tensor and pipeline parallel is a
Ray cluster. vLLM's own recipe
(``examples/online_serving/run_cluster.sh``) starts one container per node on the
host network with ``--shm-size 10.24g`` (no host IPC), ``ray start --block --head``
in the head's and ``ray start --block --address=HEAD`` in each worker's, each
with ``VLLM_HOST_IP`` set to its node's address, then runs ``vllm serve`` inside
the head's container, where the Ray driver finds the head's local session. So
here rank 0's one engine task runs ``ray start --head`` (it returns once the
head is up) and then execs ``vllm serve --distributed-executor-backend ray``;
its Ray GPU workers are that task's processes, with its GPUs, CPU and memory.
Workers start once the head's Ray port answers. vLLM itself waits for their
GPUs: its placement group waits up to 30 minutes (``PG_WAIT_TIMEOUT = 1800`` in
``vllm/executor/ray_utils.py``), so rank 0 does not wait for its workers first
(it cannot: they join the Ray head its own engine task starts).
"""

from __future__ import annotations

from llmgw.core.catalog.images import Release
from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.catalog.roles import role_args
from llmgw.core.catalog.tool_calling import tool_call_args
from llmgw.core.engines.base import (
    HeadAddress,
    KeyFromEnv,
    Launch,
    LaunchContext,
    RankLaunch,
    Step,
    Word,
    env_ref,
    ip,
    numbers,
    port,
)

HEALTH_PATH = "/health"
# The first release llmgw has read with --nnodes/--node-rank/--master-addr/--master-port
# and --headless (its flag table, llmgw/apispec/engines/vllm-flags.json): 0.11.0 has none.
NATIVE_MULTI_NODE = Release((0, 34, 0, 0), "0.34.0")
# The port of rank 0's torch.distributed store (--master-port), the group's rendezvous.
DIST_PORT = "dist"
# vLLM's API server falls back to VLLM_API_KEY when --api-key is not given
# (vllm/entrypoints/openai/api_server.py ``build_app``: ``args.api_key or
# [envs.VLLM_API_KEY]``; vllm/envs.py; 0.10.2 and 0.11.0).
KEY_INTAKE = KeyFromEnv("VLLM_API_KEY")

# Rank 0's engine: start the Ray head (it daemonises and returns), then become
# ``vllm serve``. llmgw's own text; every catalog word stays its own argv word
# ("$@"), never parsed by the shell.
RAY_HEAD_THEN_SERVE = (
    'ray start --head --port "$1" --node-ip-address "$2" --num-gpus "$3" && shift 3 && exec "$@"'
)


def launch_vllm(profile: Profile, context: LaunchContext) -> Launch:
    nodes = profile.node_count
    serve_argv: tuple[Word, ...] = (
        "vllm",
        "serve",
        context.model.engine_arg,
        "--host",
        context.container_listen_host,
        "--port",
        port("http"),
        "--served-model-name",
        context.served_name,
        "--tensor-parallel-size",
        *numbers(profile.tensor_parallel),
        "--pipeline-parallel-size",
        *numbers(profile.pipeline_parallel),
        *role_args(Engine.VLLM, context.roles),
        *tool_call_args(profile, context.roles, context.release),
        # The prompt tokens read from the prefix cache in each answer's
        # usage.prompt_tokens_details.cached_tokens, which vLLM leaves out without it
        # (FrontendArgs.enable_prompt_tokens_details, vllm/entrypoints/openai/cli_args.py,
        # in 0.10.2, 0.11.0 and 0.34.0): the router's cached-token counts and key usage.
        "--enable-prompt-tokens-details",
    )
    # Media URLs in requests must not follow redirects to internal addresses.
    engine_env: tuple[tuple[str, Word], ...] = (("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0"),)
    if nodes == 1:
        rank = RankLaunch(0, Step("engine", (*serve_argv, *profile.args), engine_env), ports=("http",))
        return Launch(Engine.VLLM, (rank,), HEALTH_PATH, containerised=True)

    if context.release is not None and context.release >= NATIVE_MULTI_NODE:
        return _native_multi_node(profile, context, serve_argv, engine_env)
    gpus = numbers(profile.gpus_per_replica_node)[0]
    # VLLM_HOST_IP: the address vLLM's workers advertise to each other (run_cluster.sh).
    host_ip: tuple[str, Word] = ("VLLM_HOST_IP", ip("ray"))
    head = RankLaunch(
        rank=0,
        serve=Step(
            "engine",
            (
                "/bin/sh",
                "-c",
                RAY_HEAD_THEN_SERVE,
                "ray-head",
                port("ray"),
                ip("ray"),
                gpus,
                *serve_argv,
                "--distributed-executor-backend",
                "ray",
                *profile.args,
            ),
            # No RAY_ADDRESS: in the head's container, Ray's driver attaches to the latest
            # local cluster (/tmp/ray/ray_current_cluster), as in vLLM's recipe.
            (*engine_env, host_ip),
        ),
        ports=("http", "ray"),
        rendezvous_port="ray",
        rendezvous_checked=True,
    )
    workers = tuple(
        RankLaunch(
            rank=rank,
            serve=Step(
                "engine",
                (
                    "ray",
                    "start",
                    "--block",
                    "--address",
                    env_ref(context.head_address_env),
                    "--node-ip-address",
                    ip("ray"),
                    "--node-manager-port",
                    port("ray"),
                    "--num-gpus",
                    gpus,
                ),
                (host_ip,),
            ),
            ports=("ray",),
            rendezvous_port="ray",
            rendezvous_checked=True,
            head_address=HeadAddress.ENV,
        )
        for rank in range(1, nodes)
    )
    return Launch(Engine.VLLM, (head, *workers), HEALTH_PATH, containerised=True)


def _native_multi_node(
    profile: Profile,
    context: LaunchContext,
    serve_argv: tuple[Word, ...],
    engine_env: tuple[tuple[str, Word], ...],
) -> Launch:
    """Every rank ``vllm serve`` with the mp executor across nodes (vLLM 0.34.0 on)."""
    nodes = profile.node_count
    # The address each rank's processes advertise to the others: its node's.
    host_env: tuple[tuple[str, Word], ...] = (*engine_env, ("VLLM_HOST_IP", ip(DIST_PORT)))

    def group(rank: int, master_addr: Word, master_port: Word) -> tuple[Word, ...]:
        return (
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            *numbers(nodes),
            "--node-rank",
            *numbers(rank),
            "--master-addr",
            master_addr,
            "--master-port",
            master_port,
        )

    head = RankLaunch(
        rank=0,
        serve=Step(
            "engine",
            (*serve_argv, *group(0, ip(DIST_PORT), port(DIST_PORT)), *profile.args),
            host_env,
        ),
        ports=("http", DIST_PORT),
        rendezvous_port=DIST_PORT,
        rendezvous_checked=True,
    )
    # A headless rank serves no API: --host/--port are rank 0's alone.
    worker_argv = tuple(
        word
        for index, word in enumerate(serve_argv)
        if not (word in ("--host", "--port") or (index > 0 and serve_argv[index - 1] in ("--host", "--port")))
    )
    workers = tuple(
        RankLaunch(
            rank=rank,
            serve=Step(
                "engine",
                (
                    *worker_argv,
                    *group(rank, env_ref(context.head_ip_env), env_ref(context.head_port_env)),
                    "--headless",
                    *profile.args,
                ),
                host_env,
            ),
            ports=(DIST_PORT,),
            head_address=HeadAddress.ENV,
        )
        for rank in range(1, nodes)
    )
    return Launch(Engine.VLLM, (head, *workers), HEALTH_PATH, containerised=True)
