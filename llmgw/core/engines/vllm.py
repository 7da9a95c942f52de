"""vLLM: ``vllm serve``; across nodes, inside the Ray head's container, with Ray workers on the other ranks.

Neither pinned release (0.10.2, 0.11.0) has ``--nnodes``/``--node-rank``: multi-node
tensor and pipeline parallel is a Ray cluster. vLLM's own recipe
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
    )
    # Media URLs in requests must not follow redirects to internal addresses.
    engine_env: tuple[tuple[str, Word], ...] = (("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0"),)
    if nodes == 1:
        rank = RankLaunch(0, Step("engine", (*serve_argv, *profile.args), engine_env), ports=("http",))
        return Launch(Engine.VLLM, (rank,), HEALTH_PATH, containerised=True)

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
