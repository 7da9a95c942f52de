"""Which ACL check Nomad 2.0.5 makes for each HTTP route the stand-in serves.

Owns: the table route -> check (a namespace capability, node or agent read, management),
each as the RPC behind the route checks it (``nomad/*_endpoint.go``, v2.0.5), and the
volume check of ``Job.Register`` (``doRegister``, "Validate Volume Permissions": a
read-write host volume needs ``mount-readwrite`` on its source, a read-only one either
mount capability; any other volume type is refused here, as CSI is not modelled).

Must not: read tokens or answer requests (``http_api.acl_middleware`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from llmgw.devcluster.acl import NomadAcl

Check = Callable[[NomadAcl, str], bool]  # (the token's ACL, the request's namespace) -> allowed


def _ns(*ops: str) -> Check:
    return lambda acl, ns: acl.allow_ns_any(ns, *ops)


def _node_read(acl: NomadAcl, _ns: str) -> bool:
    return acl.allow_node_read()


def _agent_read(acl: NomadAcl, _ns: str) -> bool:
    return acl.allow_agent_read()


def _management(acl: NomadAcl, _ns: str) -> bool:
    return acl.management


def _anyone(_acl: NomadAcl, _ns: str) -> bool:
    return True


_READ_JOB = _ns("read-job")
# (method, route pattern) -> check. Variables and the event stream decide per request
# (a path's capability, the topics), in their handlers.
ROUTE_CHECKS: dict[tuple[str, str], Check] = {
    # command/agent/job_endpoint.go JobsParseRequest: parse-job or submit-job.
    ("POST", "/v1/jobs/parse"): _ns("parse-job", "submit-job"),
    ("GET", "/v1/jobs"): _ns("list-jobs"),
    # Job.Register: submit-job or register-job (then the volumes: see register_refusal).
    ("POST", "/v1/jobs"): _ns("submit-job", "register-job"),
    ("PUT", "/v1/jobs"): _ns("submit-job", "register-job"),
    ("POST", "/v1/job/{job_id}"): _ns("submit-job", "register-job"),
    ("PUT", "/v1/job/{job_id}"): _ns("submit-job", "register-job"),
    ("GET", "/v1/job/{job_id}"): _READ_JOB,
    # Job.Deregister: submit-job, purge-job or deregister-job.
    ("DELETE", "/v1/job/{job_id}"): _ns("submit-job", "purge-job", "deregister-job"),
    # Job.Plan: submit-job or plan-job; it checks no volume.
    ("POST", "/v1/job/{job_id}/plan"): _ns("submit-job", "plan-job"),
    ("PUT", "/v1/job/{job_id}/plan"): _ns("submit-job", "plan-job"),
    ("GET", "/v1/job/{job_id}/summary"): _READ_JOB,
    ("GET", "/v1/job/{job_id}/allocations"): _READ_JOB,
    ("GET", "/v1/job/{job_id}/evaluations"): _READ_JOB,
    ("GET", "/v1/job/{job_id}/deployments"): _READ_JOB,
    ("GET", "/v1/allocations"): _READ_JOB,
    ("GET", "/v1/allocation/{alloc_id}"): _READ_JOB,
    ("POST", "/v1/allocation/{alloc_id}/stop"): _ns("alloc-lifecycle"),
    ("PUT", "/v1/allocation/{alloc_id}/stop"): _ns("alloc-lifecycle"),
    ("GET", "/v1/evaluations"): _READ_JOB,
    ("GET", "/v1/evaluation/{eval_id}"): _READ_JOB,
    ("GET", "/v1/evaluation/{eval_id}/allocations"): _READ_JOB,
    ("GET", "/v1/nodes"): _node_read,
    ("GET", "/v1/node/{node_id}"): _node_read,
    ("GET", "/v1/agent/self"): _agent_read,
    ("GET", "/v1/client/fs/logs/{alloc_id}"): _ns("read-logs"),
    ("GET", "/v1/client/fs/cat/{alloc_id}"): _ns("read-fs"),
    ("GET", "/v1/event/stream"): _anyone,
    ("GET", "/v1/var/{path}"): _anyone,
    ("PUT", "/v1/var/{path}"): _anyone,
    ("POST", "/v1/var/{path}"): _anyone,
    ("DELETE", "/v1/var/{path}"): _anyone,
}


def route_check(method: str, pattern: str) -> Check:
    """The check of a route; management for anything else (ACL policies, ``/_dev/``)."""
    return ROUTE_CHECKS.get((method, pattern), _management)


def register_refusal(acl: NomadAcl, job: Mapping[str, Any]) -> str | None:
    """``doRegister``'s volume check: None, or the rule missing (for llmgw's own reports)."""
    for group in job.get("TaskGroups") or []:
        volumes = group.get("Volumes") or {}
        for volume in volumes.values():
            kind = str(volume.get("Type") or "")
            source = str(volume.get("Source") or "")
            if kind != "host":
                return f"volume type {kind!r}"
            if volume.get("ReadOnly"):
                if not (
                    acl.allow_host_volume(source, "mount-readonly")
                    or acl.allow_host_volume(source, "mount-readwrite")
                ):
                    return f'host_volume "{source}" mount-readonly'
            elif not acl.allow_host_volume(source, "mount-readwrite"):
                return f'host_volume "{source}" mount-readwrite'
    return None


def stream_allowed(acl: NomadAcl, namespace: str, topics: Mapping[str, object]) -> bool:
    """``validateNsOp`` (nomad/event_endpoint.go): each topic's capability."""
    for topic in topics:
        if topic in ("Job", "Evaluation", "Allocation", "Deployment", "Service", "CSIPlugin"):
            allowed = acl.allow_ns_op(namespace, "read-job")
        elif topic == "Node":
            allowed = acl.allow_node_read()
        else:
            # "*", NodePool and the topics llmgw never asks for: management here
            # (Nomad checks some of them more finely; nothing in llmgw subscribes to them).
            allowed = acl.management
        if not allowed:
            return False
    return True
