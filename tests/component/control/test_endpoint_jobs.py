"""The control plane finds a replica's health under its Nomad job id.

The renderer registers rank 0 with meta ``llmgw_replica`` = the short replica id and
``llmgw_job`` = the job id; drain marks and the control plane's view are keyed by job id.
When the Consul adapter read the short id, the control plane saw no replica healthy and
rebuilt each one at its load timeout; this holds the two sides together.
"""

from __future__ import annotations

from llmgw.adapters.consul import parse_endpoint
from llmgw.control.observing import health_by_job
from llmgw.core import conventions as c
from llmgw.core.planning import ReplicaId, replica_job_id
from llmgw.core.records import EndpointSnapshot, HealthStatus

MODEL = "org/chat-model"
JOB = replica_job_id(MODEL, ReplicaId("rmx2wp4np"))


def entry(status: str) -> dict[str, object]:
    meta = {
        c.META_MODEL: MODEL,
        c.META_MODEL_SLUG: "org-chat-model-00000000",
        c.META_PROFILE: "0",
        c.META_ENGINE: "sim",
        c.META_RANK: "0",
        c.META_REPLICA: "rmx2wp4np",
        c.META_JOB: JOB,
    }
    return {
        "Node": {"Node": "gpu-1", "Address": "127.0.0.1"},
        "Service": {"ID": "svc-1", "Service": c.ENGINE_SERVICE, "Port": 9000, "Meta": meta},
        "Checks": [{"ServiceID": "svc-1", "Status": status}],
    }


def test_an_endpoint_registered_as_the_renderer_does_counts_for_its_job() -> None:
    for status in HealthStatus:
        endpoint = parse_endpoint(entry(str(status)))
        assert health_by_job(EndpointSnapshot((endpoint,), 1)) == {JOB: status}
