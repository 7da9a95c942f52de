"""SGLang: ``python3 -m sglang.launch_server`` on every node with its rank.

Across nodes every rank runs the same server command with ``--nnodes``,
``--node-rank`` and ``--dist-init-addr`` (rank 0's rendezvous address); only
rank 0 serves HTTP. Ranks block in torch's rendezvous until all have joined,
so workers only need rank 0's address before they start.
"""

from __future__ import annotations

from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.catalog.roles import role_args
from llmgw.core.engines.base import (
    HeadAddress,
    Launch,
    LaunchContext,
    RankLaunch,
    Step,
    Word,
    address,
    env_ref,
    numbers,
    port,
)

HEALTH_PATH = "/health"


def launch_sglang(profile: Profile, context: LaunchContext) -> Launch:
    nodes = profile.node_count
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
    )
    serve_api: tuple[Word, ...] = ("--host", context.container_listen_host, "--port", port("http"))
    if nodes == 1:
        rank = RankLaunch(0, Step("engine", (*common, *serve_api, *profile.args)), ports=("http",))
        return Launch(Engine.SGLANG, (rank,), HEALTH_PATH, containerised=True)

    def distributed(rank: int, init_address: Word) -> tuple[Word, ...]:
        return ("--nnodes", *numbers(nodes), "--node-rank", *numbers(rank), "--dist-init-addr", init_address)

    head = RankLaunch(
        rank=0,
        serve=Step("engine", (*common, *serve_api, *distributed(0, address("dist")), *profile.args)),
        ports=("http", "dist"),
        rendezvous_port="dist",
        rendezvous_checked=True,
    )
    workers = tuple(
        RankLaunch(
            rank=rank,
            serve=Step(
                "engine", (*common, *distributed(rank, env_ref(context.head_address_env)), *profile.args)
            ),
            ports=(),
            head_address=HeadAddress.ENV,
        )
        for rank in range(1, nodes)
    )
    return Launch(Engine.SGLANG, (head, *workers), HEALTH_PATH, containerised=True)
