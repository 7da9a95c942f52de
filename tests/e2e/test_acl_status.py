"""With ACLs enforced as in a deployment, ``llmgw status`` names the ops/acl rule a refusal asks for.

A vLLM replica with the model cache (a read-write host volume) passes Nomad's plan and
is refused on register without ``host_volume "llmgw-models"`` ``mount-readwrite`` in the
control plane's Nomad policy (Job.Register's volume check; the 403 says only
"Permission denied"); with the files as they are, it is registered.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from llmgw.cli import main
from llmgw.core.catalog import SecurityPolicy
from llmgw.devcluster.acl import ops_policies
from llmgw.devcluster.nomad.config import real_gpu_nodes
from tests.support.acl_rules import rules_of, without

from .harness import Stack, eventually

CATALOG = """
models:
  vllm-cached:
    roles: [chat]
    profiles:
      - engine: vllm
        source: meta-llama/Llama-3.1-8B-Instruct
        gpu: {model: H100, memory_gb: 80}
    scaling: {min: 1, max: 1}
"""


async def llmgw_status(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    for name in list(os.environ):
        if name.startswith("CONSUL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CONSUL_HTTP_ADDR", stack.cluster.consul_addr)
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", stack.cluster.consul_tokens["status"])
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["status"])
    out = capsys.readouterr().out
    return out if code == 0 else ""  # no status published yet


def _without_host_volume_rule() -> dict[str, str]:
    policies = ops_policies()
    text = policies["nomad-control-plane"]
    (rule,) = [r for r in rules_of("nomad-control-plane", text) if r.label.startswith("host_volume")]
    return {**policies, "nomad-control-plane": without(text, rule)}


async def test_without_the_host_volume_rule_status_names_it_and_with_it_the_replica_registers(
    tmp_path: Path,
    shipped_policy: SecurityPolicy,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with (
        Stack(
            tmp_path / "a", shipped_policy, real_gpu_nodes(1), acl_policies=_without_host_volume_rule()
        ) as stack,
        stack.services("cp-1"),
    ):
        await stack.apply(CATALOG)

        seen = [""]

        async def names_the_rule() -> str | None:
            seen[0] = await llmgw_status(stack, monkeypatch, capsys)
            return seen[0] if 'host_volume "llmgw-models"' in seen[0] else None

        try:
            out = await eventually(names_the_rule, 60, "llmgw status naming the host-volume rule")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last status:\n{seen[0]}") from None
        assert "mount-readwrite" in out and "ops/acl/nomad-control-plane.policy.hcl" in out, out
        assert "403" in out, out
        assert (await stack.nomad.jobs(prefix="llmgw-")).items == []
    async with Stack(tmp_path / "b", shipped_policy, real_gpu_nodes(1)) as stack, stack.services("cp-1"):
        await stack.apply(CATALOG)

        async def registered() -> bool:
            return bool((await stack.nomad.jobs(prefix="llmgw-")).items)

        await eventually(registered, 60, "the replica registered")
