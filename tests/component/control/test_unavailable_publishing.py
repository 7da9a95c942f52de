"""The leader tells routers which models it cannot serve now (``llmgw/unavailable``):
the plane on recorded fakes, virtual time.

A model Nomad finds no place for is published within a pass of the failed plan, with
Nomad's reason; an operator's drain is published as drained; an unchanged document is
rewritten only every ``status_refresh`` (routers read its age), not every pass."""

from __future__ import annotations

from llmgw.control import ControlSettings
from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.core.catalog.model import Engine
from llmgw.core.planning import PlanningSettings, model_key
from llmgw.core.records import Unavailability, UnavailableModels
from tests.support.control import ControlHarness

CATALOG = """
models:
  chat:
    profiles: [{engine: sim, tp: 1, gpu: {model: H100}}]
    scaling: {min: 1, max: 1}
  big:
    profiles: [{engine: sim, tp: 1, gpu: {model: B200}}]
    scaling: {min: 1, max: 1}
"""

SETTINGS = ControlSettings(planning=PlanningSettings(drain_min=1.0, drain_timeout=60.0), status_refresh=30.0)


class RecordingUnavailable:
    def __init__(self) -> None:
        self.published: list[UnavailableModels] = []

    async def publish(self, document: UnavailableModels) -> None:
        self.published.append(document)

    def listed(self) -> dict[str, Unavailability]:
        return {m.model: m.why for m in self.published[-1].models}


def harness(policy: SecurityPolicy) -> tuple[ControlHarness, RecordingUnavailable]:
    h = ControlHarness(CATALOG, policy, settings=SETTINGS)
    h.cluster.add_node("n0", gpus=2, gpu_model="H100")
    sink = RecordingUnavailable()
    h.deps.unavailable = sink
    return h, sink


async def test_an_unplaceable_model_is_published_with_nomads_reason(test_policy: SecurityPolicy) -> None:
    h, sink = harness(test_policy)
    async with h:
        await h.advance(3)
        assert sink.listed() == {"big": Unavailability.UNPLACEABLE}
        (big,) = sink.published[-1].models
        assert big.reason.startswith("no profile fits: ")
        assert sink.published[-1].catalog_sha256 == h.catalog.latest.sha256
        assert sink.published[-1].published_at <= h.clock.now


async def test_an_unchanged_document_is_refreshed_not_rewritten_each_pass(
    test_policy: SecurityPolicy,
) -> None:
    h, sink = harness(test_policy)
    async with h:
        await h.advance(3)
        first = len(sink.published)
        h.use("chat")  # triggers passes that change nothing for routers
        await h.advance(5)
        assert len(sink.published) == first
        await h.advance(40)
        assert len(sink.published) > first  # refreshed after status_refresh
        assert sink.published[-1].published_at >= h.clock.now - 31


async def test_an_operators_drain_is_published_as_drained(test_policy: SecurityPolicy) -> None:
    h, sink = harness(test_policy)
    loaded = load_catalog(CATALOG, filename="c.yaml", policy=test_policy).catalog
    assert loaded is not None
    async with h:
        await h.advance(20)
        assert "chat" not in sink.listed()
        h.commands.drain("chat", model_key(loaded.models["chat"]), by="alice", at=h.clock.now)
        await h.advance(2)
        assert sink.listed()["chat"] is Unavailability.DRAINED
        chat = next(m for m in sink.published[-1].models if m.model == "chat")
        assert chat.reason == "drained by alice"


async def test_a_rebuild_waits_for_the_gpus_its_stopping_replica_still_holds(
    test_policy: SecurityPolicy,
) -> None:
    # Nomad counts a stopping allocation's GPUs until its tasks exit (shutdown_delay, then
    # the kill): the rebuild's plan says "does not fit" meanwhile. That is a wait, not
    # "unplaceable": routers keep answering "loading", and the rebuild comes when they exit.
    planning = PlanningSettings(backoff_base=1.0, backoff_jitter=0.0, load_timeouts={Engine.SIM: 10.0})
    h = ControlHarness(CATALOG.split("  big:")[0], test_policy, settings=ControlSettings(planning=planning))
    h.cluster.add_node("n0", gpus=1, gpu_model="H100")
    h.cluster.model_load_delay["chat"] = None  # never passes its check: rebuilt at its load timeout
    h.cluster.stop_delay = 30.0
    sink = RecordingUnavailable()
    h.deps.unavailable = sink
    async with h:
        await h.advance(5)
        (first,) = h.cluster.jobs
        await h.advance(20)  # failed at 12 s, stopped whole; its GPU is held until about 42 s
        assert h.cluster.jobs == {}, "no rebuild fits while the old allocation shuts down"
        assert "chat" not in sink.listed()
        assert h.plane.reconciler is not None
        hold = h.plane.reconciler.state.models["chat"].hold
        assert hold is not None and hold.freeing
        assert hold.reason.startswith("waiting for GPUs that stopping allocations give back (1 still held")
        await h.advance(20)  # the old allocation exited: the rebuild places
        (rebuilt,) = h.cluster.jobs
        assert rebuilt != first
        assert "chat" not in sink.listed()
