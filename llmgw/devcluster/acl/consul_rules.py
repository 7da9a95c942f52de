"""Consul's ACL policy language, the part llmgw's policies use, and Consul's default-deny checks.

Owns: parsing rules (``service``, ``service_prefix``, ``node``, ``node_prefix``, ``key``,
``key_prefix``, ``session``, ``session_prefix``, ``agent``, ``agent_prefix`` blocks with
``policy = "read" | "write" | "deny"`` (``list`` too for keys), as ``acl/policy.go``),
merging a token's policies (the strongest of the same rule wins, deny first, as
``acl/policy_merger.go``), and deciding a read or write of one named resource: an exact
rule, else the longest matching prefix, else the default policy ``deny``; ``write``
implies ``read`` (``acl/policy_authorizer.go``).

Must not: do I/O or know HTTP routes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from llmgw.devcluster.acl.policy_files import PolicyProblem, read_rules

RESOURCES = ("service", "node", "key", "session", "agent")
_LEVELS = {"deny": 0, "list": 1, "read": 2, "write": 3}
# acl/policy_merger.go takesPrecedenceOver: deny, then write, then read, then list.
_PRECEDENCE = {"deny": 4, "write": 3, "read": 2, "list": 1}


class Access(StrEnum):
    LIST = "list"
    READ = "read"
    WRITE = "write"


class ConsulDenied(Exception):
    """Consul's ``PermissionDeniedError`` text: what the token lacks, on what."""

    def __init__(self, resource: str, name: str, access: Access, accessor: str) -> None:
        self.resource, self.name, self.access, self.accessor = resource, name, access, accessor
        super().__init__(
            f"Permission denied: token with AccessorID '{accessor}' lacks permission "
            f"'{resource}:{access.value}' on \"{name}\""
        )


@dataclass(frozen=True)
class ConsulPolicy:
    # (resource, is_prefix, name) -> policy word
    rules: tuple[tuple[str, bool, str, str], ...] = ()


def parse_consul_policy(rules: str, what: str = "policy") -> ConsulPolicy:
    out: list[tuple[str, bool, str, str]] = []
    for block in read_rules(rules, what):
        prefix = block.type.endswith("_prefix")
        resource = block.type.removesuffix("_prefix")
        if resource not in RESOURCES or len(block.labels) != 1 or block.blocks:
            raise PolicyProblem(
                f"{what}: {block.type!r} is not a rule the llmgw dev stand-in reads "
                f"({', '.join(f'{r}, {r}_prefix' for r in RESOURCES)})"
            )
        word = block.attributes.get("policy", "")
        allowed = {"deny", "read", "write", "list"} if resource == "key" else {"deny", "read", "write"}
        if not isinstance(word, str) or word not in allowed:
            raise PolicyProblem(f'Invalid {block.type} policy: {block.type}"{block.labels[0]}": {word!r}')
        out.append((resource, prefix, block.labels[0], word))
    return ConsulPolicy(tuple(out))


@dataclass(frozen=True)
class ConsulAcl:
    """A token's merged rules; ``management`` may do anything. ``accessor`` names it in denials."""

    accessor: str
    management: bool = False
    exact: dict[tuple[str, str], str] = field(default_factory=dict)
    prefixes: dict[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def of(cls, accessor: str, policies: list[ConsulPolicy], *, management: bool = False) -> ConsulAcl:
        exact: dict[tuple[str, str], str] = {}
        prefixes: dict[tuple[str, str], str] = {}
        for policy in policies:
            for resource, is_prefix, name, word in policy.rules:
                table = prefixes if is_prefix else exact
                have = table.get((resource, name))
                if have is None or _PRECEDENCE[word] > _PRECEDENCE[have]:
                    table[(resource, name)] = word
        return cls(accessor, management, exact, prefixes)

    def level(self, resource: str, name: str) -> str:
        """The policy word that applies to ``name``: exact, else the longest prefix, else deny."""
        word = self.exact.get((resource, name))
        if word is not None:
            return word
        best = ""
        found = "deny"
        for (res, prefix), value in self.prefixes.items():
            if res == resource and name.startswith(prefix) and len(prefix) >= len(best):
                best, found = prefix, value
        return found

    def allows(self, resource: str, name: str, access: Access) -> bool:
        if self.management:
            return True
        return _LEVELS[self.level(resource, name)] >= _LEVELS[access.value]

    def require(self, resource: str, name: str, access: Access) -> None:
        if not self.allows(resource, name, access):
            raise ConsulDenied(resource, name, access, self.accessor)

    def allows_key_list(self, prefix: str) -> bool:
        """``KeyList``: list (or read, or write) on the prefix; Consul then filters each key by read."""
        if self.management:
            return True
        return _LEVELS[self.level("key", prefix)] >= _LEVELS["list"]
