"""An engine endpoint's health as Consul reports it, read the way the router must read it."""

from __future__ import annotations

from typing import Any

from llmgw.adapters.consul import parse_endpoint
from llmgw.core import conventions as c

META = {
    c.META_MODEL: "m",
    c.META_MODEL_SLUG: "m-1",
    c.META_REPLICA: "0",
    c.META_JOB: "llmgw-m-1-0",
    c.META_ALLOC: "a1",
    c.META_ENGINE: "sim",
    c.META_PROFILE: "0",
    c.META_RANK: "0",
    c.META_SIMULATED: "true",
}


def entry(checks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "Node": {"Node": "n1", "Address": "127.0.0.1"},
        "Service": {
            "ID": "s1",
            "Service": c.ENGINE_SERVICE,
            "Address": "127.0.0.1",
            "Port": 8000,
            "Meta": META,
            "Tags": [],
        },
        "Checks": checks,
    }


SERF = {"CheckID": "serfHealth", "ServiceID": "", "Status": "passing"}


def test_a_service_without_its_own_check_is_not_healthy_yet() -> None:
    # Nomad registers the service, then its check: in between Consul says "passing".
    assert parse_endpoint(entry([SERF])).status == "critical"


def test_status_is_the_worst_check() -> None:
    engine = {"CheckID": "c1", "ServiceID": "s1"}
    assert parse_endpoint(entry([SERF, {**engine, "Status": "passing"}])).status == "passing"
    assert parse_endpoint(entry([SERF, {**engine, "Status": "warning"}])).status == "warning"
    assert (
        parse_endpoint(entry([{**SERF, "Status": "critical"}, {**engine, "Status": "passing"}])).status
        == "critical"
    )


def test_an_endpoint_names_its_replica_by_the_nomad_job_id() -> None:
    # Drain marks and the control plane name replicas by job id; the short replica id
    # in llmgw_replica must not be taken for it.
    endpoint = parse_endpoint(entry([SERF, {"CheckID": "c1", "ServiceID": "s1", "Status": "passing"}]))
    assert endpoint.replica == META[c.META_JOB] == "llmgw-m-1-0"
