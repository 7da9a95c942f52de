"""Reading ACL policy text (HCL) into plain blocks, and finding llmgw's policy files.

Owns: turning a policy's HCL into :class:`RuleBlock` values with llmgw's own HCL
parser (``llmgw.apispec.jobspec.syntax``; Nomad and Consul parse policies with HCL1,
whose syntax the policy files' subset shares: labelled blocks, string and list
attributes), and where ``ops/acl/`` is (a checkout's, or the wheel's copy).

Must not: decide anything about access (``nomad_rules``, ``consul_rules`` do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmgw.apispec.jobspec.diagnostics import SyntaxProblem
from llmgw.apispec.jobspec.expressions import Context, Literal, Template, TupleCons
from llmgw.apispec.jobspec.syntax import Body, parse
from llmgw.bundled import acl_policy_dir

# The components llmgw dev and the e2e tests run, each with the token of its policy file.
NOMAD_COMPONENTS = ("control-plane", "router", "ci")
CONSUL_COMPONENTS = ("control-plane", "router", "status", "nomad-agent", "engine-tasks")


class PolicyProblem(ValueError):
    """Policy text a real server would refuse (Nomad and Consul answer 400 with the reason)."""


@dataclass(frozen=True)
class RuleBlock:
    type: str
    labels: tuple[str, ...]
    attributes: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    blocks: tuple[RuleBlock, ...] = ()


_CONTEXT = Context({}, {}, unknown_as_text=False)


def _value(expr: object, name: str) -> str | tuple[str, ...]:
    if isinstance(expr, (Literal, Template)):
        value = expr.eval(_CONTEXT)
        if isinstance(value, str):
            return value
    if isinstance(expr, TupleCons):
        items = [item.eval(_CONTEXT) for item in expr.items]
        if all(isinstance(item, str) for item in items):
            return tuple(str(item) for item in items)
    raise PolicyProblem(f"{name}: a policy attribute is a string or a list of strings")


def _blocks(body: Body) -> tuple[RuleBlock, ...]:
    out = []
    for block in body.blocks:
        attributes = {name: _value(a.expr, name) for name, a in block.body.attributes.items()}
        out.append(RuleBlock(block.type, tuple(block.labels), attributes, _blocks(block.body)))
    return tuple(out)


def read_rules(text: str, what: str) -> tuple[RuleBlock, ...]:
    """The blocks of a policy's rules; a top-level attribute becomes a block with no body."""
    try:
        body = parse(text, what)
    except SyntaxProblem as exc:
        raise PolicyProblem(f"{what}: failed to parse policy: {exc.summary} {exc.detail}".strip()) from exc
    top = tuple(RuleBlock(name, (), {"policy": _value(a.expr, name)}) for name, a in body.attributes.items())
    return top + _blocks(body)


def policy_dir() -> Path:
    return acl_policy_dir()


def ops_policies(directory: Path | None = None) -> dict[str, str]:
    """Every policy file of ``ops/acl/`` by its file name without ``.policy.hcl``
    (``nomad-control-plane``, ``consul-router``, ...), as text."""
    folder = directory or policy_dir()
    return {
        path.name.removesuffix(".policy.hcl"): path.read_text(encoding="utf-8")
        for path in sorted(folder.glob("*.policy.hcl"))
    }
