"""A multi-node replica forms only when its worker ranks can read Consul, and ``llmgw status`` says why not.

A worker rank finds its head through a template reading the health of ``llmgw-rank``,
in its ``await-head`` prestart task. With ACLs on, that read needs three things, each
taken away here on the Nomad and Consul stand-ins enforcing the ``ops/acl`` files:

- a Consul token for the template: the group's Consul workload identity (llmgw renders
  ``consul {}`` for it; the servers' ``consul { task_identity }`` signs it) or the
  client's ``template { use_client_consul_token = true }``. Without either, Nomad
  2.0.4+ gives the template ``"invalid-token"``, Consul answers 403 "ACL not found",
  and the task is killed with "Template failed" once its retries run out;
- ``node_prefix "" { policy = "read" }`` in that token's policy: Consul's health answer
  is filtered by node (agent/consul/acl.go, ``filterCheckServiceNodes``) with no error,
  so the worker reads no head and waits while rank 0's engine runs.

With the files as they are (or the client setting and the agents' policy), the replica forms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw.core.catalog import SecurityPolicy
from llmgw.devcluster.acl import ops_policies
from tests.support.acl_rules import rules_of, without

from .harness import Stack, eventually, healthy_jobs, nodes
from .test_acl_status import llmgw_status

pytestmark = pytest.mark.e2e

CATALOG = """
models:
  sim-two-node:
    roles: [chat]
    profiles:
      - engine: sim
        tp: 2
        nodes: 2
        sim: {tokens_per_second: 200, load_seconds: 0.5}
    scaling: {min: 1, max: 1}
"""
MODEL = "sim-two-node"


def _without_node_read(policy: str) -> dict[str, str]:
    policies = ops_policies()
    text = policies[policy]
    (rule,) = [r for r in rules_of(policy, text) if r.label.startswith('node_prefix ""')]
    return {**policies, policy: without(text, rule)}


async def _status_saying(
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: str,
    what: str,
) -> str:
    seen = [""]

    async def says() -> str | None:
        seen[0] = await llmgw_status(stack, monkeypatch, capsys)
        return seen[0] if words in seen[0] else None

    try:
        return await eventually(says, 90, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status:\n{seen[0]}") from None


async def _forms(
    tmp_path: Path, policy: SecurityPolicy, *, policies: dict[str, str] | None = None, **nomad: Any
) -> None:
    async with (
        Stack(tmp_path, policy, nodes(2, gpus=2), acl_policies=policies, nomad=nomad) as stack,
        stack.services("cp-1"),
    ):
        await stack.apply(CATALOG)
        await eventually(lambda: healthy_jobs(stack.consul, MODEL), 90, "the two-node replica healthy")


async def test_without_node_read_the_worker_waits_and_status_names_the_rule(
    tmp_path: Path,
    shipped_policy: SecurityPolicy,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    policies = _without_node_read("consul-engine-tasks")
    async with (
        Stack(tmp_path, shipped_policy, nodes(2, gpus=2), acl_policies=policies) as stack,
        stack.services("cp-1"),
    ):
        await stack.apply(CATALOG)
        out = await _status_saying(
            stack, monkeypatch, capsys, "node_prefix", "llmgw status naming node_prefix read"
        )
        assert "waiting for its replica's head" in out, out
        assert "rank 0's engine runs" in out, out
        assert "ops/acl/consul-engine-tasks.policy.hcl" in out, out
        # Consul filtered the worker's read without an error, as the real server does: the
        # worker waits, and the replica is not serving.
        assert not await healthy_jobs(stack.consul, MODEL)


async def test_without_a_consul_identity_the_template_fails_and_status_says_which_token(
    tmp_path: Path,
    shipped_policy: SecurityPolicy,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Nomad servers with no consul { task_identity }: no task gets a Consul identity, so
    # every template reads Consul with "invalid-token".
    async with (
        Stack(
            tmp_path,
            shipped_policy,
            nodes(2, gpus=2),
            nomad={"consul_task_identity": False, "template_consul_attempts": 3},
        ) as stack,
        stack.services("cp-1"),
    ):
        await stack.apply(CATALOG)
        out = await _status_saying(
            stack, monkeypatch, capsys, "use_client_consul_token", "llmgw status naming the template's token"
        )
        assert "ACL not found" in out and "invalid-token" in out, out
        assert "consul {}" in out, out


async def test_the_client_setting_forms_the_replica_only_with_node_read_in_the_agents_policy(
    tmp_path: Path,
    shipped_policy: SecurityPolicy,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client_token = {"consul_task_identity": False, "template_use_client_consul_token": True}
    await _forms(tmp_path / "as-given", shipped_policy, **client_token)
    async with (
        Stack(
            tmp_path / "no-node-read",
            shipped_policy,
            nodes(2, gpus=2),
            acl_policies=_without_node_read("consul-nomad-agent"),
            nomad=client_token,
        ) as stack,
        stack.services("cp-1"),
    ):
        await stack.apply(CATALOG)
        out = await _status_saying(
            stack, monkeypatch, capsys, "node_prefix", "llmgw status naming node_prefix read"
        )
        assert "waiting for its replica's head" in out, out


async def test_with_the_files_as_given_the_replica_forms(
    tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    await _forms(tmp_path, shipped_policy)
