"""Nomad's ACL policy language, the part llmgw's policies use, and the checks Nomad 2.0.5 makes.

Owns: parsing a policy (``namespace "<glob>" { policy, capabilities, variables { path
"<glob>" { capabilities } } }``, ``host_volume "<glob>" { policy, capabilities }``,
``node { policy }``, ``agent { policy }``) as ``acl/policy.go`` does (a ``policy`` expands
to capabilities; unknown capabilities are refused), merging a token's policies as
``acl/acl.go`` ``NewACL`` does (capabilities add up; ``deny`` clears a namespace and wins;
``node``/``agent`` take the highest privilege, deny first), and answering
``AllowNsOp``, ``AllowHostVolumeOperation``, ``AllowNodeRead``, ``AllowAgentRead`` and
``AllowVariableOperation`` (a concrete name first, then the closest glob).

Must not: do I/O or know HTTP routes (the stand-in's middleware maps routes to checks).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from llmgw.devcluster.acl.policy_files import PolicyProblem, RuleBlock, read_rules

# acl/policy.go, Nomad 2.0.5: the namespace capabilities, and what each policy word grants.
NAMESPACE_CAPABILITIES = frozenset(
    [
        "deny",
        "list-jobs",
        "parse-job",
        "read-job",
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-node-exec",
        "alloc-lifecycle",
        "csi-register-plugin",
        "csi-write-volume",
        "csi-read-volume",
        "csi-list-volume",
        "csi-mount-volume",
        "host-volume-create",
        "host-volume-register",
        "host-volume-read",
        "host-volume-write",
        "host-volume-delete",
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
        "scale-job",
        "register-job",
        "revert-job",
        "deregister-job",
        "purge-job",
        "evaluate-job",
        "plan-job",
        "tag-job-version",
        "stable-job",
        "fail-deployment",
        "pause-deployment",
        "promote-deployment",
        "unblock-deployment",
        "cancel-deployment",
        "set-alloc-health-deployment",
        "gc-allocation",
        "pause-allocation",
        "force-periodic-job",
        "delete-service-registration",
        "sentinel-override",
        "submit-recommendation",
    ]
)
_NS_READ = [
    "list-jobs",
    "parse-job",
    "read-job",
    "csi-list-volume",
    "csi-read-volume",
    "read-job-scaling",
    "list-scaling-policies",
    "read-scaling-policy",
    "host-volume-read",
]
_NS_WRITE = [
    *_NS_READ,
    "scale-job",
    "submit-job",
    "dispatch-job",
    "read-logs",
    "read-fs",
    "alloc-exec",
    "alloc-lifecycle",
    "csi-mount-volume",
    "csi-write-volume",
    "submit-recommendation",
    "host-volume-create",
]
_NS_POLICY = {
    "deny": ["deny"],
    "read": _NS_READ,
    "write": _NS_WRITE,
    "scale": [
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
        "scale-job",
        "read-job",
        "submit-recommendation",
    ],
}
HOST_VOLUME_CAPABILITIES = frozenset({"deny", "mount-readonly", "mount-readwrite"})
_HV_POLICY = {"deny": ["deny"], "read": ["mount-readonly"], "write": ["mount-readonly", "mount-readwrite"]}
VARIABLE_CAPABILITIES = frozenset({"write", "read", "list", "destroy", "deny"})
_PLAIN_POLICIES = frozenset({"deny", "read", "write"})
# A workload's own Variables: read and list, without any policy (acl/acl.go).
_WORKLOAD_IMPLICIT = frozenset({"read", "list"})


@dataclass(frozen=True)
class NomadPolicy:
    namespaces: tuple[tuple[str, frozenset[str]], ...] = ()
    variables: tuple[tuple[str, str, frozenset[str]], ...] = ()  # (namespace glob, path glob, caps)
    host_volumes: tuple[tuple[str, frozenset[str]], ...] = ()
    node: str = ""
    agent: str = ""


def _strings(block: RuleBlock, name: str) -> tuple[str, ...]:
    value = block.attributes.get(name, ())
    return (value,) if isinstance(value, str) else value


def _policy_word(block: RuleBlock) -> str:
    value = block.attributes.get("policy", "")
    if not isinstance(value, str):
        raise PolicyProblem(f"{block.type}: policy is a string")
    return value


def _capabilities(
    block: RuleBlock, valid: frozenset[str], expand: dict[str, list[str]], what: str
) -> frozenset[str]:
    word = _policy_word(block)
    if word and word not in expand:
        raise PolicyProblem(f"Invalid {what} policy: {block.labels[0] if block.labels else ''!r}")
    caps = set(expand.get(word, []))
    for cap in _strings(block, "capabilities"):
        if cap not in valid:
            raise PolicyProblem(f"Invalid {what} capability '{cap}'")
        caps.add(cap)
    if "host-volume-write" in caps:
        caps |= {"host-volume-register", "host-volume-create", "host-volume-delete", "host-volume-read"}
    if "host-volume-register" in caps:
        caps |= {"host-volume-create", "host-volume-read"}
    if "host-volume-create" in caps:
        caps.add("host-volume-read")
    return frozenset(caps)


def parse_nomad_policy(rules: str, what: str = "policy") -> NomadPolicy:
    """A policy's rules as ``acl.Parse`` reads them; :class:`PolicyProblem` for what Nomad refuses."""
    namespaces: list[tuple[str, frozenset[str]]] = []
    variables: list[tuple[str, str, frozenset[str]]] = []
    volumes: list[tuple[str, frozenset[str]]] = []
    node = agent = ""
    for block in read_rules(rules, what):
        if block.type == "namespace" and len(block.labels) == 1:
            name = block.labels[0]
            namespaces.append((name, _capabilities(block, NAMESPACE_CAPABILITIES, _NS_POLICY, "namespace")))
            for inner in block.blocks:
                if inner.type != "variables":
                    raise PolicyProblem(f"{what}: namespace {name!r}: unexpected block {inner.type!r}")
                for path in inner.blocks:
                    if path.type != "path" or len(path.labels) != 1:
                        raise PolicyProblem(f'{what}: variables: expected path "<glob>" blocks')
                    caps = frozenset(_strings(path, "capabilities"))
                    bad = caps - VARIABLE_CAPABILITIES
                    if bad:
                        raise PolicyProblem(f"Invalid variable capabilities: {sorted(bad)}")
                    variables.append((name, path.labels[0], caps))
        elif block.type == "host_volume" and len(block.labels) == 1:
            caps = _capabilities(block, HOST_VOLUME_CAPABILITIES, _HV_POLICY, "host volume")
            volumes.append((block.labels[0], caps))
        elif block.type in ("node", "agent") and not block.labels:
            word = _policy_word(block)
            if word not in _PLAIN_POLICIES:
                raise PolicyProblem(f"Invalid {block.type} policy: {word!r}")
            if block.type == "node":
                node = word
            else:
                agent = word
        else:
            # acl/policy.go refuses keys it does not know ("Invalid or duplicate key ...");
            # the stand-in also refuses the parts of the language llmgw's policies do not use.
            raise PolicyProblem(
                f"{what}: {block.type!r} is not a rule the llmgw dev stand-in reads (namespace, "
                "host_volume, node, agent)"
            )
    return NomadPolicy(tuple(namespaces), tuple(variables), tuple(volumes), node, agent)


def _max_privilege(a: str, b: str) -> str:
    for word in ("deny", "write", "read"):
        if word in (a, b):
            return word
    return ""


def _closest(table: dict[str, frozenset[str]], name: str) -> frozenset[str] | None:
    """``matching*CapabilitySet``: the concrete entry, else the glob with the least left to match."""
    if name in table:
        return table[name]
    globs = [
        (len(name) - len(glob) + glob.count("*"), caps)
        for glob, caps in table.items()
        if "*" in glob and fnmatch.fnmatchcase(name, glob)
    ]
    return min(globs, key=lambda g: g[0])[1] if globs else None


@dataclass(frozen=True)
class NomadAcl:
    """A token's policies merged (``acl.NewACL``); ``management`` allows everything."""

    management: bool = False
    namespaces: dict[str, frozenset[str]] = field(default_factory=dict)
    variables: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    host_volumes: dict[str, frozenset[str]] = field(default_factory=dict)
    node: str = ""
    agent: str = ""

    @classmethod
    def of(cls, policies: list[NomadPolicy], *, management: bool = False) -> NomadAcl:
        namespaces: dict[str, frozenset[str]] = {}
        variables: dict[tuple[str, str], frozenset[str]] = {}
        volumes: dict[str, frozenset[str]] = {}
        node = agent = ""
        for policy in policies:
            for name, caps in policy.namespaces:
                have = namespaces.get(name, frozenset())
                namespaces[name] = (
                    have if "deny" in have else (frozenset({"deny"}) if "deny" in caps else have | caps)
                )
            for ns, path, caps in policy.variables:
                variables[(ns, path)] = variables.get((ns, path), frozenset()) | caps
            for name, caps in policy.host_volumes:
                have = volumes.get(name, frozenset())
                volumes[name] = (
                    have if "deny" in have else (frozenset({"deny"}) if "deny" in caps else have | caps)
                )
            node = _max_privilege(node, policy.node)
            agent = _max_privilege(agent, policy.agent)
        return cls(management, namespaces, variables, volumes, node, agent)

    def allow_ns_op(self, namespace: str, op: str) -> bool:
        if self.management:
            return True
        caps = _closest(self.namespaces, namespace)
        return caps is not None and op in caps

    def allow_ns_any(self, namespace: str, *ops: str) -> bool:
        return any(self.allow_ns_op(namespace, op) for op in ops)

    def allow_host_volume(self, name: str, op: str) -> bool:
        if self.management:
            return True
        caps = _closest(self.host_volumes, name)
        return caps is not None and op in caps

    def allow_node_read(self) -> bool:
        return self.management or self.node in ("read", "write")

    def allow_node_write(self) -> bool:
        return self.management or self.node == "write"

    def allow_agent_read(self) -> bool:
        return self.management or self.agent in ("read", "write")

    def allow_variable(
        self, namespace: str, path: str, op: str, workload: tuple[str, str, str] | None
    ) -> bool:
        """``AllowVariableOperation``: a token's path rules; a workload's own paths
        (``nomad/jobs``, ``nomad/jobs/<job>[/<group>[/<task>]]``) read and list without any."""
        if self.management:
            return True
        rules = {path_glob: caps for (ns, path_glob), caps in self.variables.items() if ns == namespace}
        if workload is not None:
            job, group, task = workload
            implicit = {
                "nomad/jobs",
                f"nomad/jobs/{job}",
                f"nomad/jobs/{job}/{group}",
                f"nomad/jobs/{job}/{group}/{task}",
            }
            if path not in rules and path in implicit:
                return op in _WORKLOAD_IMPLICIT
        caps = _closest(rules, path)
        return caps is not None and "deny" not in caps and op in caps
