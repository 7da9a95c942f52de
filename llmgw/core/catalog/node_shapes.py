"""Whether a profile's GPUs per node fit the nodes this cluster has (``LLMGW_NODE_GPUS``).

The catalog declares a replica's shape (``tp``, ``pp``, ``nodes``; ``gpus_per_node`` for
llama.cpp) and which GPUs it wants (``gpu.model``), never the cluster's nodes: Nomad
knows those. The renderer asks Nomad's device plugin for ``gpus_per_replica_node`` GPUs in
each task group (``device "nvidia/gpu" { count }``), one group a node, so a group asking
for more GPUs than any node has is never placed. The operator states the largest nodes
per GPU model in ``LLMGW_NODE_GPUS`` (``H100=8,L4=4``, or a bare ``8`` for any model), and
the catalog's doors refuse what no such node can hold, with the change to make.

How the engines spread ranks over nodes (what the group's count is):

- vLLM 0.34.0 (``vllm/config/parallel.py``): a replica's world size is ``tp × pp``; on one
  node it must not exceed the node's GPUs ("World size (12) is larger than the number of
  available GPUs (8) in this node ... set '--nnodes' appropriately"); with ``--nnodes`` each
  node runs ``local_world_size = world_size // nnodes`` ranks (``v1/executor/
  multiproc_executor.py`` asserts it divides).
- SGLang 0.5.23 (``srt/entrypoints/engine.py``, ``_calculate_rank_ranges``): each node runs
  ``pp // nnodes`` pipeline and ``tp // nnodes-per-tp-group`` tensor ranks, the same
  ``tp × pp / nnodes`` GPUs.
- llama.cpp runs on one node, on its ``gpus_per_node``.

Without the setting nothing is checked here (the catalog is portable across clusters) and
Nomad's plan says "does not fit" in the status. A model's profiles are in order of
preference and may name GPUs one cluster lacks: a profile no node can hold is a warning
while another profile of the model fits, an error when none does.

Must not: read the environment (``llmgw.render.settings`` does).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.core.catalog.model import MAX_GPUS_PER_NODE, Engine, Profile

NODE_GPUS_SETTING = "LLMGW_NODE_GPUS"


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """The most GPUs one node of the cluster has, of one GPU model ("" for any model)."""

    model: str
    count: int


_ENTRY = re.compile(r"^(?:(?P<model>[A-Za-z0-9][A-Za-z0-9 ._-]{0,63})=)?(?P<count>[0-9]{1,3})$")


def parse_node_gpus(text: str) -> tuple[NodeGpus, ...]:
    """``LLMGW_NODE_GPUS``: comma-separated ``MODEL=COUNT`` (or a bare ``COUNT`` for any
    model); ValueError naming an entry of another form."""
    shapes: list[NodeGpus] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        match = _ENTRY.fullmatch(entry)
        if match is None or not 0 <= int(match["count"]) <= MAX_GPUS_PER_NODE:
            raise ValueError(
                f"{entry!r} is not MODEL=COUNT or COUNT (the most GPUs one node has, 0 to "
                f"{MAX_GPUS_PER_NODE}; e.g. H100=8,L4=4, or 8 for every node)"
            )
        shapes.append(NodeGpus((match["model"] or "").strip(), int(match["count"])))
    return tuple(shapes)


def _same_gpu(wanted: str, listed: str) -> bool:
    """As the device constraint matches: a whole word of one in the other, any case."""
    a, b = wanted.casefold(), listed.casefold()
    return bool(re.search(rf"(?<![A-Za-z0-9]){re.escape(a)}(?![A-Za-z0-9])", b)) or bool(
        re.search(rf"(?<![A-Za-z0-9]){re.escape(b)}(?![A-Za-z0-9])", a)
    )


def largest_node(profile: Profile, shapes: Sequence[NodeGpus]) -> int:
    """The most GPUs a node the profile's GPU constraint accepts has (0: no such node)."""
    wanted = profile.gpu.model if profile.gpu is not None else None
    counts = [s.count for s in shapes if not s.model or wanted is None or _same_gpu(wanted, s.model)]
    return max(counts, default=0)


def shape_refusal(profile: Profile, shapes: Sequence[NodeGpus]) -> tuple[str, str] | None:
    """``(key, why and what to write)`` when no node of ``shapes`` can hold one of the
    profile's groups; None when one can, when it asks for no GPU, or with no shapes."""
    if not shapes or not profile.requests_gpus:
        return None
    needed = profile.gpus_per_replica_node
    largest = largest_node(profile, shapes)
    if needed <= largest:
        return None
    wanted = profile.gpu.model if profile.gpu is not None and profile.gpu.model else None
    of = f" with {wanted}" if wanted else ""
    listed = ", ".join(f"{s.model}={s.count}" if s.model else str(s.count) for s in shapes)
    if largest == 0:
        return (
            "gpu" if wanted else "engine",
            f"no node has {wanted + ' ' if wanted else ''}GPUs ({NODE_GPUS_SETTING}={listed}): "
            "name a GPU model it lists",
        )
    holds = f"the largest node{of} has {largest} GPUs ({NODE_GPUS_SETTING}={listed})"
    if profile.engine is Engine.LLAMACPP:
        return (
            "gpus_per_node",
            f"gpus_per_node is {needed}, but {holds}: write gpus_per_node: {largest} or fewer",
        )
    gpus = profile.tensor_parallel * profile.pipeline_parallel
    nodes = profile.node_count
    spread = next(
        (n for n in range(nodes + 1, gpus + 1) if gpus % n == 0 and gpus // n <= largest),
        None,
    )
    here = "one node" if nodes == 1 else f"each of {nodes} nodes"
    fix = f"nodes: {spread} ({gpus // spread} GPUs on each)" if spread is not None else "fewer GPUs"
    key = "nodes" if profile.nodes is not None else ("tp" if profile.tp is not None else "pp")
    return (
        key,
        f"tp × pp = {profile.tensor_parallel} × {profile.pipeline_parallel} = {gpus} GPUs puts "
        f"{needed} on {here}, but {holds}; the engine runs tp × pp / nodes ranks on each node: "
        f"write {fix}, or a tp × pp of at most {largest * nodes}",
    )
