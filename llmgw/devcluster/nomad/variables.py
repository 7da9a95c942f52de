"""Nomad Variables and the ACL policies attached to workloads, as the dev stand-in keeps them.

Owns: the variables (``/v1/var/<path>``: items, indexes, check-and-set), the ACL
policies written with a ``JobACL`` (the only policies the stand-in's single
management token needs: those a workload identity resolves), and the one decision
Nomad makes when a task's template reads a variable: may this workload read this
path? That decision follows Nomad's ``acl.ACL.matchingVariablesCapabilitySet``
(``acl/acl.go``, Nomad 2.0): a policy's concrete path first, then the implicit
paths of the workload (``nomad/jobs``, ``nomad/jobs/<job>``,
``nomad/jobs/<job>/<group>``, ``nomad/jobs/<job>/<group>/<task>``, read and list),
then the closest matching glob. Policies reach a workload as
``ResolvePoliciesForClaims`` (``nomad/auth/auth.go``) finds them: a ``JobACL``
naming its namespace and job (and, if set, group and task), or its namespace alone.

A policy's ``Rules`` is parsed only as far as variables go:
``namespace "<ns>" { variables { path "<glob>" { capabilities = [...] } } }``;
anything else in it is refused with a message naming what the stand-in reads.

Must not: do I/O (``wait_change`` only waits on an event the writes set).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import re
from dataclasses import dataclass, field

# Nomad's variable path rule (nomad/structs/variables.go, validPath) and its reserved prefix:
# under nomad/ only nomad/jobs and below may be written.
_VALID_PATH = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")
_POLICY_NAME = re.compile(r"^[a-zA-Z0-9-]{1,128}$")
WORKLOAD_CAPABILITIES = frozenset({"read", "list"})


class VariableProblem(ValueError):
    """A request Nomad would refuse (400); the message says why."""


class CasConflict(Exception):
    """A check-and-set write whose index no longer matches (Nomad answers 409 with the current variable)."""

    def __init__(self, current: Variable | None) -> None:
        super().__init__("cas conflict")
        self.current = current


@dataclass
class Variable:
    namespace: str
    path: str
    items: dict[str, str]
    create_index: int
    modify_index: int
    create_time: int
    modify_time: int

    def json(self) -> dict[str, object]:
        return {
            "Namespace": self.namespace,
            "Path": self.path,
            "Items": dict(self.items),
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
            "CreateTime": self.create_time,
            "ModifyTime": self.modify_time,
        }


@dataclass(frozen=True)
class Workload:
    """Who a task's workload identity says it is (its claims)."""

    namespace: str
    job: str
    group: str
    task: str


@dataclass(frozen=True)
class JobAcl:
    namespace: str
    job: str = ""
    group: str = ""
    task: str = ""

    def applies_to(self, who: Workload) -> bool:
        if self.namespace != who.namespace:
            return False
        if not self.job:
            return True  # a namespace-wide workload policy (ACLPolicyByNamespace)
        if self.job != who.job:
            return False
        if not self.group:
            return True
        return self.group == who.group and (not self.task or self.task == who.task)


@dataclass(frozen=True)
class Policy:
    name: str
    rules: str
    job_acl: JobAcl | None
    # (namespace, path glob) -> capabilities
    variables: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    def json(self) -> dict[str, object]:
        acl = self.job_acl
        return {
            "Name": self.name,
            "Description": "",
            "Rules": self.rules,
            "JobACL": None
            if acl is None
            else {"Namespace": acl.namespace, "JobID": acl.job, "Group": acl.group, "Task": acl.task},
        }


def check_path(path: str) -> str:
    path = path.strip("/")
    if not _VALID_PATH.fullmatch(path) or "//" in path:
        raise VariableProblem(f'invalid path "{path}"')
    if (path == "nomad" or path.startswith("nomad/")) and not (
        path == "nomad/jobs" or path.startswith("nomad/jobs/")
    ):
        raise VariableProblem(f'"{path}": "nomad" is a reserved top-level directory path')
    return path


_RULE_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<word>[A-Za-z_][A-Za-z0-9_-]*)|(?P<sym>[{}\[\]=,]))'
)


def _tokens(text: str) -> list[str]:
    text = re.sub(r"(?m)(#|//).*$", "", text)
    out: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _RULE_TOKEN.match(text, pos)
        if match is None:
            raise VariableProblem(f"policy rules: unexpected {text[pos:].strip()[:20]!r}")
        out.append(match.group(match.lastgroup or ""))
        pos = match.end()
    return out


def parse_variable_rules(rules: str) -> dict[tuple[str, str], frozenset[str]]:
    """The variables part of a policy.

    ``namespace "ns" { variables { path "p" { capabilities = [..] } } }``, repeated.
    """
    toks = _tokens(rules)
    pos = 0
    unsupported = (
        "the dev stand-in reads only "
        'namespace "<ns>" { variables { path "<path>" { capabilities = ["read", ...] } } } in policy rules'
    )

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(toks):
            raise VariableProblem(f"policy rules end early: {unsupported}")
        tok = toks[pos]
        if expected is not None and tok != expected:
            raise VariableProblem(f"policy rules: expected {expected!r}, found {tok!r}: {unsupported}")
        pos += 1
        return tok

    def string() -> str:
        tok = take()
        if not tok.startswith('"'):
            raise VariableProblem(f"policy rules: expected a quoted string, found {tok!r}")
        return tok[1:-1]

    found: dict[tuple[str, str], frozenset[str]] = {}
    while pos < len(toks):
        take("namespace")
        namespace = string()
        take("{")
        take("variables")
        take("{")
        while toks[pos : pos + 1] == ["path"]:
            take("path")
            path = string()
            take("{")
            take("capabilities")
            take("=")
            take("[")
            caps: set[str] = set()
            while toks[pos : pos + 1] != ["]"]:
                caps.add(string())
                if toks[pos : pos + 1] == [","]:
                    take(",")
            take("]")
            take("}")
            found[(namespace, path)] = frozenset(caps)
        take("}")
        take("}")
    return found


def parse_policy(name: str, body: dict[str, object]) -> Policy:
    if not _POLICY_NAME.fullmatch(name):
        raise VariableProblem(f"invalid name {name!r}")
    rules = str(body.get("Rules") or "")
    raw_acl = body.get("JobACL")
    job_acl = None
    if isinstance(raw_acl, dict):
        job_acl = JobAcl(
            str(raw_acl.get("Namespace") or ""),
            str(raw_acl.get("JobID") or ""),
            str(raw_acl.get("Group") or ""),
            str(raw_acl.get("Task") or ""),
        )
        # nomad/structs/acl.go ACLPolicy.Validate: each level needs the one above it.
        if job_acl.job and not job_acl.namespace:
            raise VariableProblem("namespace must be set to set job ID")
        if job_acl.group and not job_acl.job:
            raise VariableProblem("job ID must be set to set group")
        if job_acl.task and not job_acl.group:
            raise VariableProblem("group must be set to set task")
    return Policy(name, rules, job_acl, parse_variable_rules(rules))


class Variables:
    """The stand-in's variables and workload policies; indexes come from ``next_index``."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], Variable] = {}
        self.policies: dict[str, Policy] = {}
        self.index = 1
        self._changed = asyncio.Event()

    def _wrote(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, seconds: float) -> None:
        """Return at the next write or after ``seconds`` (a template's watch of its variables)."""
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), seconds)

    def get(self, namespace: str, path: str) -> Variable | None:
        return self.items.get((namespace, check_path(path)))

    def put(
        self, namespace: str, path: str, items: dict[str, str], now_ns: int, cas: int | None = None
    ) -> Variable:
        path = check_path(path)
        if not items:
            raise VariableProblem("variable missing required Items object")
        current = self.items.get((namespace, path))
        if cas is not None and (current.modify_index if current else 0) != cas:
            raise CasConflict(current)
        self.index += 1
        created = current.create_index if current else self.index
        created_at = current.create_time if current else now_ns
        variable = Variable(namespace, path, dict(items), created, self.index, created_at, now_ns)
        self.items[(namespace, path)] = variable
        self._wrote()
        return variable

    def delete(self, namespace: str, path: str, cas: int | None = None) -> None:
        path = check_path(path)
        current = self.items.get((namespace, path))
        if cas is not None and (current.modify_index if current else 0) != cas:
            raise CasConflict(current)
        self.index += 1
        self.items.pop((namespace, path), None)
        self._wrote()

    def put_policy(self, policy: Policy) -> None:
        self.policies[policy.name] = policy

    def workload_may_read(self, who: Workload, path: str) -> bool:
        """Nomad's matchingVariablesCapabilitySet for a workload identity, then the ``read`` check."""
        rules: dict[tuple[str, str], frozenset[str]] = {}
        for policy in self.policies.values():
            if policy.job_acl is not None and policy.job_acl.applies_to(who):
                for key, caps in policy.variables.items():
                    rules[key] = rules.get(key, frozenset()) | caps
        concrete = rules.get((who.namespace, path))
        if concrete is not None:
            return "read" in concrete and "deny" not in concrete
        implicit = {
            "nomad/jobs",
            f"nomad/jobs/{who.job}",
            f"nomad/jobs/{who.job}/{who.group}",
            f"nomad/jobs/{who.job}/{who.group}/{who.task}",
        }
        if path in implicit:
            return "read" in WORKLOAD_CAPABILITIES
        # The closest matching glob: the one with the fewest characters left to the wildcard.
        globs = [
            (len(path) - len(glob) + glob.count("*"), caps)
            for (namespace, glob), caps in rules.items()
            if "*" in glob and namespace == who.namespace and fnmatch.fnmatchcase(path, glob)
        ]
        if not globs:
            return False
        caps = min(globs, key=lambda g: g[0])[1]
        return "read" in caps and "deny" not in caps
