"""A replica Nomad places or runs that Consul does not list yet (``routing.placed_replicas``)
counts as a replica starting: its model is answered as loading, exactly as when its
registration is there and not passing yet. A failed, stopping or lost allocation, one of
a rank that registers no engine, or a model with no allocation keeps ``no_healthy_replica``."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import Catalog, load_catalog
from llmgw.core.names import slug
from llmgw.core.records import Endpoint, HealthStatus
from llmgw.core.routing import (
    ENGINE_GROUP,
    AllocationFact,
    NomadView,
    job_model_slug,
    model_state,
    placed_replicas,
    plan_route,
    refusal_for,
    unserved_reason,
)

MODEL = "running"
SLUG = slug(MODEL)
JOB = f"llmgw-{SLUG}-r1"
ALLOC = "6d1a3c0e-0000-4000-8000-000000000001"

FACT = AllocationFact(
    alloc_id=ALLOC,
    job_id=JOB,
    node_id="node-1",
    client_status="pending",
    desired_run=True,
    addresses=frozenset({("10.0.0.7", 24101)}),
    group=ENGINE_GROUP,
)
# The registration Nomad makes for FACT's allocation.
REGISTERED = Endpoint(
    service_id=f"_nomad-task-{ALLOC}-group-rank-0-llmgw-engine-http",
    node="gpu-1",
    model=MODEL,
    model_slug=SLUG,
    replica=JOB,
    alloc_id=ALLOC,
    address="10.0.0.7",
    port=24101,
    engine="sim",
    profile=0,
    simulated=True,
    status=HealthStatus.CRITICAL,
)

CATALOG_TEXT = """
models:
  running:   {roles: [chat], profiles: [{engine: sim}], scaling: {min: 1, max: 2}}
  on-demand: {roles: [chat], profiles: [{engine: sim}], scaling: {min: 0, max: 1}}
"""


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    result = load_catalog(CATALOG_TEXT, filename="c.yaml", policy=read_security_policy())
    assert result.catalog is not None, result.diagnostics
    return result.catalog


def view(*facts: AllocationFact, gone: frozenset[str] = frozenset()) -> NomadView:
    return NomadView({f.alloc_id: f for f in facts}, gone, 10)


SECOND = replace(FACT, alloc_id="a2", job_id=f"llmgw-{SLUG}-r2", client_status="running")


@pytest.mark.parametrize(
    ("facts", "endpoints", "gone", "draining", "placed"),
    [
        # Placed, its group's service not registered yet (prerun hooks, the image, the sync).
        ([FACT], [], (), (), {SLUG: 1}),
        # Running, its registration not in Consul yet (Nomad's sync to Consul delayed, retried).
        ([replace(FACT, client_status="running")], [], (), (), {SLUG: 1}),
        ([FACT, SECOND], [], (), (), {SLUG: 2}),
        # Registered: ``loading_endpoints`` judges it from its history, not counted twice.
        ([FACT], [REGISTERED], (), (), {}),
        ([FACT], [replace(REGISTERED, status=HealthStatus.PASSING)], (), (), {}),
        ([FACT, SECOND], [REGISTERED], (), (), {SLUG: 1}),
        # A registration Nomad would not have made for it (another port) does not hide it.
        ([FACT], [replace(REGISTERED, port=31337)], (), (), {SLUG: 1}),
        ([FACT], [replace(REGISTERED, replica=f"llmgw-{SLUG}-r9")], (), (), {SLUG: 1}),
        # No replica coming from it: failed, done, lost, its node unreachable or gone, told to stop.
        ([replace(FACT, client_status="failed")], [], (), (), {}),
        ([replace(FACT, client_status="complete")], [], (), (), {}),
        ([replace(FACT, client_status="lost")], [], (), (), {}),
        ([replace(FACT, client_status="unknown")], [], (), (), {}),
        ([replace(FACT, client_status="")], [], (), (), {}),
        ([FACT], [], ("node-1",), (), {}),
        ([replace(FACT, desired_run=False)], [], (), (), {}),
        ([replace(FACT, client_status="running", desired_run=False)], [], (), (), {}),
        ([FACT], [], (), (JOB,), {}),  # an operator drains the replica
        # Ranks past 0 never register an engine; a group Nomad did not name is not known to.
        ([replace(FACT, group="rank-1")], [], (), (), {}),
        ([replace(FACT, group="")], [], (), (), {}),
        # Jobs llmgw does not name so.
        ([replace(FACT, job_id="evil-job")], [], (), (), {}),
        ([replace(FACT, job_id="llmgw-")], [], (), (), {}),
        ([replace(FACT, job_id=f"llmgw-{SLUG}-")], [], (), (), {}),
        # Nothing placed at all.
        ([], [], (), (), {}),
    ],
)
def test_which_allocations_count_as_a_replica_coming(
    facts: list[AllocationFact],
    endpoints: list[Endpoint],
    gone: tuple[str, ...],
    draining: tuple[str, ...],
    placed: dict[str, int],
) -> None:
    assert placed_replicas(view(*facts, gone=frozenset(gone)), endpoints, draining) == placed


@pytest.mark.parametrize(
    ("job_id", "model_slug"),
    [
        (f"llmgw-{SLUG}-r1", SLUG),
        ("llmgw-meta-llama-3-1-8b-7b633509-r0abc", "meta-llama-3-1-8b-7b633509"),
        ("llmgw-a-0", "a"),
        ("llmgw-", None),
        ("llmgw-a-", None),
        ("llmgw--r1", None),
        ("llmgw-nodash", None),
        ("nomad-a-r1", None),
        ("", None),
    ],
)
def test_a_replica_jobs_model_slug(job_id: str, model_slug: str | None) -> None:
    assert job_model_slug(job_id) == model_slug


def test_the_answer_is_the_one_for_a_registered_replica_loading(catalog: Catalog) -> None:
    """A placed replica, counted as ``model_state``'s loading endpoints, gets the very
    answer a registered replica loading gets, which is an on-demand load's."""

    def answer(model: str, loading: int) -> tuple[int, str | None, int | None, bool]:
        state = model_state(catalog.models[model], 0, False, loading)
        plan = plan_route((model,), {model: state})
        reason = unserved_reason(state, waited_for=plan.wait_for, failures=0)
        refusal = refusal_for(reason, model, retry_after=10, waited_for=plan.wait_for)
        return refusal.status, refusal.code, refusal.retry_after, refusal.retryable

    placed = placed_replicas(view(FACT), [], ()).get(slug(MODEL), 0)
    assert answer(MODEL, placed) == answer("on-demand", 0) == (503, "model_loading", 10, True)
    failed = placed_replicas(view(replace(FACT, client_status="failed")), [], ()).get(slug(MODEL), 0)
    assert answer(MODEL, failed) == (503, "no_healthy_replica", 10, True)


def test_the_engine_group_is_the_one_rendered_jobs_register_the_engine_in() -> None:
    """``ENGINE_GROUP`` is a name the renderer gives: every rendered replica job has its
    ``llmgw-engine`` service in that group, and in no other."""
    jobspecs = sorted((Path(__file__).parents[3] / "jobspecs").glob("*.nomad.hcl"))
    assert jobspecs
    for path in jobspecs:
        groups = re.split(r'^  group "', path.read_text(), flags=re.MULTILINE)[1:]
        engine_groups = [g.split('"', 1)[0] for g in groups if 'name     = "llmgw-engine"' in g]
        assert engine_groups == [ENGINE_GROUP], path.name
