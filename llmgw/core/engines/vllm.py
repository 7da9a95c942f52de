"""vLLM: ``vllm serve``; across nodes, a Ray cluster whose head runs beside rank 0's server.

vLLM's documented multi-node recipe (docs/serving/parallelism_scaling.md) is a
Ray cluster: ``ray start --head`` on one node, ``ray start --address`` on the
others, then ``vllm serve`` on the head with tensor parallel = GPUs per node and
pipeline parallel = nodes (here: whatever the catalog's tp and pp say), and
``--distributed-executor-backend ray``. The workers must have joined before the
server starts, so rank 0 waits for them.
"""

from __future__ import annotations

from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.engines.base import (
    HeadAddress,
    Launch,
    LaunchContext,
    RankLaunch,
    Step,
    Word,
    address,
    env_ref,
    ip,
    numbers,
    port,
)

HEALTH_PATH = "/health"


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
    )
    # Media URLs in requests must not follow redirects to internal addresses.
    engine_env: tuple[tuple[str, Word], ...] = (("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0"),)
    if nodes == 1:
        rank = RankLaunch(0, Step("engine", (*serve_argv, *profile.args), engine_env), ports=("http",))
        return Launch(Engine.VLLM, (rank,), HEALTH_PATH, containerised=True)

    gpus = numbers(profile.gpus_per_replica_node)[0]
    head = RankLaunch(
        rank=0,
        serve=Step(
            "engine",
            (*serve_argv, "--distributed-executor-backend", "ray", *profile.args),
            (*engine_env, ("RAY_ADDRESS", address("ray"))),
        ),
        ports=("http", "ray"),
        rendezvous_port="ray",
        rendezvous_checked=True,
        sidecars=(
            Step(
                "ray-head",
                (
                    "ray",
                    "start",
                    "--head",
                    "--block",
                    "--port",
                    port("ray"),
                    "--node-ip-address",
                    ip("ray"),
                    "--num-gpus",
                    gpus,
                ),
            ),
        ),
        waits_for_ranks=nodes - 1,
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
            ),
            ports=("ray",),
            rendezvous_port="ray",
            rendezvous_checked=True,
            head_address=HeadAddress.ENV,
        )
        for rank in range(1, nodes)
    )
    return Launch(Engine.VLLM, (head, *workers), HEALTH_PATH, containerised=True)
