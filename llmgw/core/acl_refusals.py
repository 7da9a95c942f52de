"""Which ``ops/acl`` rule a refusal llmgw sees asks for, in the policy file's own words.

Owns the mapping from what Nomad and Consul answer when a token lacks a rule to the
rule and the file it belongs in. Nomad's 403 names no rule ("Permission denied",
``structs.ErrPermissionDenied``), so the rule follows from which call was refused
(Nomad v2.0.5 ``nomad/job_endpoint.go``: ``Job.Plan`` takes ``submit-job`` or
``plan-job`` and checks no volume; ``Job.Register`` takes ``submit-job`` and then, in
``doRegister``'s "Validate Volume Permissions", ``mount-readwrite`` on the source of every
read-write host volume). Consul's names the permission (``acl/errors.go``:
``Permission denied: token with AccessorID '...' lacks permission 'service:read' on
"llmgw-rank"``); its "ACL not found" is a token Consul does not know, which is what a
Nomad task's template holds when the task has no Consul workload identity: Nomad 2.0.4
and later give it ``"invalid-token"`` unless the client sets ``template {
use_client_consul_token = true }`` (``client/allocrunner/taskrunner/template_hook.go``).
A template that cannot read is reported by Nomad as the task's ``Killing`` event
"Template failed: <dependency>: Unexpected response code: 403 (...)" once
consul-template's retries run out (``client/allocrunner/taskrunner/template/template.go``,
``handleFirstRender``; consul-template ``watch/view.go``, ``poll``).

Must not: do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

CONTROL_PLANE_NOMAD = "ops/acl/nomad-control-plane.policy.hcl"
ENGINE_TASKS_CONSUL = "ops/acl/consul-engine-tasks.policy.hcl"

_LACKS = re.compile(r"lacks permission '(?P<resource>[a-z]+):(?P<access>[a-z]+)' on \"(?P<name>[^\"]*)\"")


def _read_write_host_volumes(job: Mapping[str, Any]) -> list[str]:
    sources: set[str] = set()
    for group in job.get("TaskGroups") or []:
        for volume in (group.get("Volumes") or {}).values():
            if volume.get("Type") == "host" and not volume.get("ReadOnly"):
                sources.add(str(volume.get("Source") or ""))
    return sorted(sources)


def register_refused(job: Mapping[str, Any], namespace: str) -> str:
    """What a 403 on ``Job.Register`` asks of the control plane's Nomad token, after the
    same token's plan of the same job passed."""
    volumes = _read_write_host_volumes(job)
    submit = f'namespace "{namespace}" {{ capabilities = ["submit-job"] }}'
    if volumes:
        rules = " and ".join(f'host_volume "{v}" {{ capabilities = ["mount-readwrite"] }}' for v in volumes)
        return (
            f"the control plane's Nomad token lacks {rules} ({CONTROL_PLANE_NOMAD}): Job.Register "
            "checks mount-readwrite for every read-write host volume, Job.Plan does not (or it "
            f"lacks {submit})"
        )
    return (
        f"the control plane's Nomad token may plan but not register: it lacks {submit} "
        f"({CONTROL_PLANE_NOMAD})"
    )


def nomad_call_refused(call: str, namespace: str, path: str = "") -> str:
    """What a 403 on one of the control plane's other Nomad calls asks for."""
    rules = {
        "plan": f'namespace "{namespace}" {{ capabilities = ["submit-job"] }}',
        "write variable": (
            f'namespace "{namespace}" {{ variables {{ path "{path}" {{ capabilities = ["write"] }} }} }}'
        ),
    }
    return f"the control plane's Nomad token lacks {rules[call]} ({CONTROL_PLANE_NOMAD})"


def template_refused(message: str) -> str | None:
    """The rule a task's "Template failed" message asks for, or None when it is no ACL refusal."""
    if "Template failed" not in message or "403" not in message:
        return None
    if "ACL not found" in message:
        return (
            "a Consul token for the task's templates: Nomad gives a task without a Consul workload "
            'identity "invalid-token" (Nomad >= 2.0.4); the group needs consul {} (llmgw renders it '
            "for every group whose templates read Consul), the Nomad servers consul { task_identity "
            "{ ... } } and Consul the nomad-workloads auth method and binding rule (ops/acl/apply.sh), "
            "or the client's template { use_client_consul_token = true }"
        )
    lacks = _LACKS.search(message)
    if lacks:
        resource, access, name = lacks.group("resource", "access", "name")
        rule = f'{resource} "{name}" {{ policy = "{access}" }}'
        return f"{rule} in the engine tasks' policy ({ENGINE_TASKS_CONSUL})"
    return None


# Consul drops what a token may not read from a health answer without an error
# (agent/consul/acl.go, filterCheckServiceNodes: node read and service read), so a worker
# rank whose token lacks them reads no rank 0, renders nothing and waits. Nomad says
# nothing about it; the control plane names both rules when a worker never got rank 0's
# address while rank 0 ran.
RANKS_UNREAD = (
    "the worker ranks never read rank 0's address from Consul: the engine tasks' policy "
    f'needs service "llmgw-rank" and node_prefix "" {{ policy = "read" }} ({ENGINE_TASKS_CONSUL}), '
    "which Consul filters its health answers by without an error"
)
