"""llmgw's simulated engine: a plain process per rank, rendezvous over its own HTTP port.

Rank 0 serves the OpenAI API and holds one rendezvous stream per worker; it is
healthy only once every worker has joined, and exits when one leaves, so a
lost shard takes the replica down as it would with a real engine. Workers poll
a file a Nomad template fills with rank 0's address.
"""

from __future__ import annotations

from llmgw.core.catalog.model import Engine, Profile
from llmgw.core.engines.base import (
    HeadAddress,
    KeyFromEnv,
    Launch,
    LaunchContext,
    RankLaunch,
    Step,
    Word,
    ip,
    numbers,
    port,
)

HEALTH_PATH = "/health"
# As vLLM (llmgw.core.engines.vllm): the key from VLLM_API_KEY (llmgw/sim/settings.py).
KEY_INTAKE = KeyFromEnv("VLLM_API_KEY")


def launch_sim(profile: Profile, context: LaunchContext) -> Launch:
    nodes = profile.node_count
    options: list[Word] = []
    if profile.sim is not None and profile.sim.tokens_per_second is not None:
        options += ["--token-rate", repr(profile.sim.tokens_per_second)]
    if profile.sim is not None and profile.sim.load_seconds is not None:
        options += ["--load-time", repr(profile.sim.load_seconds)]

    def argv(rank: int, *where: Word) -> tuple[Word, ...]:
        return (
            *context.llmgw_command,
            "sim",
            *where,
            "--model",
            context.model.engine_arg,
            "--served-model-name",
            context.served_name,
            "--rank",
            *numbers(rank),
            "--world-size",
            *numbers(nodes),
            # As vLLM is rendered (llmgw.core.engines.vllm): cached tokens in the usage.
            "--enable-prompt-tokens-details",
            *options,
            *profile.args,
        )

    ranks = [
        RankLaunch(
            0,
            Step("engine", argv(0, "--host", ip("http"), "--port", port("http"))),
            ports=("http",),
            rendezvous_port="http" if nodes > 1 else None,
            rendezvous_checked=nodes > 1,
        )
    ]
    for rank in range(1, nodes):
        ranks.append(
            RankLaunch(
                rank,
                Step(
                    "engine",
                    argv(
                        rank,
                        "--host",
                        ip("http"),
                        "--port",
                        port("http"),
                        "--head-file",
                        context.head_address_file,
                    ),
                ),
                ports=("http",),
                rendezvous_port="http",
                rendezvous_checked=True,
                head_address=HeadAddress.FILE,
            )
        )
    return Launch(Engine.SIM, tuple(ranks), HEALTH_PATH, containerised=False)
