"""The executor's own rules, seen through the Simulation (which applies through the real
``Executor`` over ``FakeNomad``): what Nomad is asked, and what the outcome says."""

from __future__ import annotations

from llmgw.core.catalog import Catalog
from llmgw.core.planning import Failed, Placed, PlaceReplica
from llmgw.render import RenderedJob, ReplicaRequest
from tests.support.control import FakeCluster, FakeRenderer, Simulation

CATALOG = Catalog.model_validate(
    {
        "models": {
            "m": {
                "profiles": [{"engine": "sim", "tp": 1, "gpu": {"model": "H100"}}],
                "scaling": {"min": 1, "max": 1},
            }
        }
    }
)


def cluster() -> FakeCluster:
    c = FakeCluster(start_delay=2.0, load_delay=10.0)
    c.add_node("n0")
    c.add_node("n1")
    return c


def first_job_id() -> str:
    """The job id the planner gives the model's first replica (the same in every run)."""
    probe = Simulation(CATALOG, cluster())
    probe.step()
    (job,) = probe.cluster.running_jobs("m")
    return job


def test_a_new_leader_behind_a_register_adopts_the_job_instead_of_registering_it_again() -> None:
    sim = Simulation(CATALOG, cluster())
    before = sim.observe()  # the view a new leader has before the register shows in it
    sim.step()
    (job,) = sim.cluster.running_jobs("m")
    sim.restart_leader()  # no memory of the register
    sim.step(observed=before)
    (adopted,) = sim.actions(PlaceReplica)[1:]
    assert isinstance(adopted.outcome, Placed) and adopted.action.job_id == job
    assert sim.nomad.called("register") == [job]  # Nomad was asked once
    assert sim.cluster.running_jobs("m") == [job]


def test_a_job_llmgw_did_not_make_under_the_replicas_id_is_left_alone_and_the_placement_fails() -> None:
    job = first_job_id()
    c = cluster()
    c.start_foreign_job(job, node="n0", gpus=1)
    sim = Simulation(CATALOG, c)
    sim.step()
    (placement,) = sim.actions(PlaceReplica)
    assert isinstance(placement.outcome, Failed)
    assert placement.outcome.error == f"a job {job} exists already and is not this replica"
    assert sim.nomad.called("register") == []
    assert c.jobs[job].job["Meta"] == {"owner": "someone else"}


class RenamingRenderer(FakeRenderer):
    """A renderer whose templates name the job differently from the planner's rule."""

    def render(self, catalog: Catalog, request: ReplicaRequest, *, catalog_hash: str) -> RenderedJob:
        rendered = super().render(catalog, request, catalog_hash=catalog_hash)
        return RenderedJob("renamed-" + rendered.job_id, rendered.hcl, rendered.spec_hash, rendered.template)


def test_a_renderer_that_names_another_job_than_the_plan_fails_the_placement_and_registers_nothing() -> None:
    sim = Simulation(CATALOG, cluster(), renderer=RenamingRenderer())
    sim.step()
    (placement,) = sim.actions(PlaceReplica)
    job = placement.action.job_id
    assert isinstance(placement.outcome, Failed)
    assert placement.outcome.error == f"the renderer names the job renamed-{job}, the plan {job}"
    assert sim.nomad.called("register") == [] and sim.cluster.running_jobs() == []
