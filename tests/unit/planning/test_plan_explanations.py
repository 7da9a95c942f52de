"""A plan that does not place, in words: what the group asked for, why no node had it, and the fix.

``FailedTGAllocs`` is Nomad's AllocationMetric per group; the filter reasons are the
scheduler's own (``scheduler/feasible/feasible.go`` in Nomad v2.0.5: "missing drivers",
"missing devices") or a constraint's ``String()``.
"""

from __future__ import annotations

from typing import Any

from llmgw.adapters.nomad.plans import explain_plan


def job(*drivers: str) -> dict[str, Any]:
    tasks = [{"Name": f"t{i}", "Driver": d, "Resources": {}} for i, d in enumerate(drivers)]
    return {"ID": "j", "TaskGroups": [{"Name": "rank-0", "Tasks": tasks}]}


def failed(reason: str, count: int = 2) -> dict[str, Any]:
    return {"FailedTGAllocs": {"rank-0": {"NodesEvaluated": count, "ConstraintFiltered": {reason: count}}}}


def test_missing_drivers_names_each_driver_the_group_uses_and_its_client_setting() -> None:
    outcome = explain_plan(job("raw_exec", "docker"), failed("missing drivers"))
    assert not outcome.feasible
    assert "2 filtered by missing drivers (needs Docker running on the node" in outcome.explanation
    assert 'plugin "raw_exec" { config { enabled = true } }' in outcome.explanation
    sim_only = explain_plan(job("raw_exec"), failed("missing drivers")).explanation
    assert "raw_exec" in sim_only and "Docker" not in sim_only


def test_missing_devices_names_the_nvidia_device_plugin() -> None:
    outcome = explain_plan(job("docker"), failed("missing devices"))
    assert "filtered by missing devices (needs Nomad's NVIDIA device plugin" in outcome.explanation


def test_a_docker_fingerprint_constraint_names_the_docker_setting() -> None:
    volumes = explain_plan(job("docker"), failed("${attr.driver.docker.volumes.enabled} = true")).explanation
    assert 'plugin "docker" { config { volumes { enabled = true } } }' in volumes
    runtime = explain_plan(job("docker"), failed("${attr.driver.docker.runtimes} set_contains nvidia"))
    assert "nvidia-ctk runtime configure --runtime=docker" in runtime.explanation


def test_a_reason_no_client_setting_fixes_is_left_as_nomad_wrote_it() -> None:
    outcome = explain_plan(job("docker"), failed("${meta.llmgw_fabric} = ib-a"))
    assert outcome.explanation.endswith("(of 2 node(s) evaluated: 2 filtered by ${meta.llmgw_fabric} = ib-a)")
