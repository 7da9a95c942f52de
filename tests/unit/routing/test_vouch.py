"""Whether Nomad vouches for a Consul endpoint (``routing.vouch``): a table of
registrations, honest and forged, against Nomad's allocations."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.core.names import slug
from llmgw.core.records import Endpoint, HealthStatus
from llmgw.core.routing import AllocationFact, NomadView, Vouch, canonical_address, vouch

MODEL = "sim-chat"
JOB = f"llmgw-{slug(MODEL)}-0"
ALLOC = "6d1a3c0e-0000-4000-8000-000000000001"

ENDPOINT = Endpoint(
    service_id=f"_nomad-task-{ALLOC}-group-rank-0-llmgw-engine-http",
    node="gpu-1",
    model=MODEL,
    model_slug=slug(MODEL),
    replica=JOB,
    alloc_id=ALLOC,
    address="10.0.0.7",
    port=24101,
    engine="sim",
    profile=0,
    simulated=True,
    status=HealthStatus.PASSING,
)
FACT = AllocationFact(
    alloc_id=ALLOC,
    job_id=JOB,
    node_id="node-1",
    client_status="running",
    desired_run=True,
    addresses=frozenset({("10.0.0.7", 24101)}),
)


def view(*facts: AllocationFact, gone: frozenset[str] = frozenset()) -> NomadView:
    return NomadView({f.alloc_id: f for f in facts}, gone, 10)


@pytest.mark.parametrize(
    ("endpoint", "facts", "gone", "expected"),
    [
        # the honest case
        (ENDPOINT, [FACT], frozenset(), Vouch.ROUTE),
        # what Nomad takes away or holds back
        (ENDPOINT, [replace(FACT, desired_run=False)], frozenset(), Vouch.STOPPING),
        (ENDPOINT, [replace(FACT, client_status="failed")], frozenset(), Vouch.GONE),
        (ENDPOINT, [replace(FACT, client_status="complete")], frozenset(), Vouch.GONE),
        (ENDPOINT, [replace(FACT, client_status="lost", desired_run=False)], frozenset(), Vouch.GONE),
        (ENDPOINT, [replace(FACT, client_status="unknown")], frozenset(), Vouch.GONE),  # node disconnected
        (ENDPOINT, [FACT], frozenset({"node-1"}), Vouch.GONE),  # node down before its allocs are marked
        (ENDPOINT, [replace(FACT, client_status="pending")], frozenset(), Vouch.STARTING),
        # forgeries
        (ENDPOINT, [], frozenset(), Vouch.UNMATCHED),  # no such allocation
        (replace(ENDPOINT, address="10.0.0.66"), [FACT], frozenset(), Vouch.UNMATCHED),  # another host
        (replace(ENDPOINT, port=31337), [FACT], frozenset(), Vouch.UNMATCHED),  # same host, another port
        (replace(ENDPOINT, alloc_id=""), [FACT], frozenset(), Vouch.UNMATCHED),  # no alloc id at all
        # a real allocation of another job of the same model (its alloc id copied)
        (replace(ENDPOINT, replica=f"llmgw-{slug(MODEL)}-1"), [FACT], frozenset(), Vouch.UNMATCHED),
        # the real engine's address, claiming another model (would be sent that model's prompts)
        (
            replace(ENDPOINT, model="other", model_slug=slug("other")),
            [FACT],
            frozenset(),
            Vouch.UNMATCHED,
        ),
        (replace(ENDPOINT, model_slug=slug("other")), [FACT], frozenset(), Vouch.UNMATCHED),
        # an allocation of a job that is not llmgw's, at the address it registered
        (
            replace(ENDPOINT, replica="evil-job", alloc_id="a2"),
            [replace(FACT, alloc_id="a2", job_id="evil-job")],
            frozenset(),
            Vouch.UNMATCHED,
        ),
    ],
)
def test_vouch(
    endpoint: Endpoint, facts: list[AllocationFact], gone: frozenset[str], expected: Vouch
) -> None:
    assert vouch(endpoint, view(*facts, gone=gone), current=True) is expected


def test_before_nomad_answered_nothing_is_vouched_for_and_nothing_is_called_forged() -> None:
    assert vouch(ENDPOINT, None, current=False) is Vouch.UNVERIFIED
    assert vouch(ENDPOINT, None, current=True) is Vouch.UNVERIFIED


def test_a_stale_view_keeps_what_it_trusted_and_takes_away_what_it_saw_fail() -> None:
    assert vouch(ENDPOINT, view(FACT), current=False) is Vouch.ROUTE
    failed = view(replace(FACT, client_status="failed"))
    assert vouch(ENDPOINT, failed, current=False) is Vouch.GONE
    # A new endpoint (its allocation unseen) waits; it is not counted as forged.
    assert vouch(ENDPOINT, view(), current=False) is Vouch.UNVERIFIED
    assert vouch(replace(ENDPOINT, port=1), view(FACT), current=False) is Vouch.UNVERIFIED
    # Names that disagree can never match, whatever Nomad says.
    assert vouch(replace(ENDPOINT, alloc_id=""), view(FACT), current=False) is Vouch.UNMATCHED


def test_addresses_compare_as_ip_addresses() -> None:
    v6 = replace(FACT, addresses=frozenset({(canonical_address("fd00:0:0::7"), 24101)}))
    assert vouch(replace(ENDPOINT, address="fd00::7"), view(v6), current=True) is Vouch.ROUTE
    assert canonical_address("Engine.Local") == "engine.local"
