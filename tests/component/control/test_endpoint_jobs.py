"""Which Nomad job an engine endpoint belongs to, whichever meta the Consul adapter read it from.

The renderer registers rank 0 with meta ``llmgw_replica`` = the replica id and
``llmgw_job`` = the job id; ``parse_endpoint`` puts the first one it finds in
``Endpoint.replica``. The control plane must match endpoints to its jobs either way, or it
sees no replica healthy (and rebuilds each one at its load timeout).
"""

from __future__ import annotations

from llmgw.adapters.consul import parse_endpoint
from llmgw.control.observing import health_by_job, job_of
from llmgw.core import conventions as c
from llmgw.core.planning import ReplicaId, replica_job_id
from llmgw.core.records import EndpointSnapshot, HealthStatus


def entry(meta: dict[str, str], status: str = "passing") -> dict[str, object]:
    return {
        "Node": {"Node": "gpu-1", "Address": "127.0.0.1"},
        "Service": {"ID": "svc-1", "Service": c.ENGINE_SERVICE, "Port": 9000, "Meta": meta},
        "Checks": [{"ServiceID": "svc-1", "Status": status}],
    }


MODEL = "org/chat-model"
JOB = replica_job_id(MODEL, ReplicaId("rmx2wp4np"))
META = {
    c.META_MODEL: MODEL,
    c.META_MODEL_SLUG: "org-chat-model-00000000",
    c.META_PROFILE: "0",
    c.META_ENGINE: "sim",
    c.META_RANK: "0",
}


def test_an_endpoint_registered_as_the_renderer_does_maps_to_its_job() -> None:
    endpoint = parse_endpoint(entry({**META, c.META_REPLICA: "rmx2wp4np", c.META_JOB: JOB}))
    assert job_of(endpoint) == JOB
    assert health_by_job(EndpointSnapshot((endpoint,), 1)) == {JOB: HealthStatus.PASSING}


def test_an_endpoint_that_names_only_its_job_maps_to_it() -> None:
    endpoint = parse_endpoint(entry({**META, c.META_JOB: JOB}, status="critical"))
    assert job_of(endpoint) == JOB
    assert health_by_job(EndpointSnapshot((endpoint,), 1)) == {JOB: HealthStatus.CRITICAL}
