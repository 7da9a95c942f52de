"""The rules of an ``ops/acl`` policy file one by one, and the file with one of them taken out.

A rule is what an operator could leave out of a policy and still have a policy the
server accepts: one capability of a ``namespace``, ``variables`` path or ``host_volume``
block (Nomad), or one whole block with a ``policy`` word (Nomad's ``node``, every Consul
rule). The file is read with the stand-ins' own policy reader
(``llmgw.devcluster.acl.policy_files.read_rules``), so a rule added to a file is a rule
the tests take out, with no list to keep in step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from llmgw.devcluster.acl.policy_files import RuleBlock, read_rules


@dataclass(frozen=True)
class Rule:
    policy: str  # the file's name without .policy.hcl ("nomad-control-plane")
    where: tuple[int, ...]  # block indexes, outermost first
    capability: str | None  # one capability of that block; None: the whole block
    label: str  # the rule in the file's own words, for test ids and messages

    def __str__(self) -> str:
        return f"{self.policy}: {self.label}"


def _head(block: RuleBlock) -> str:
    return " ".join([block.type, *(json.dumps(label) for label in block.labels)])


def rules_of(policy: str, text: str) -> list[Rule]:
    out: list[Rule] = []

    def walk(blocks: tuple[RuleBlock, ...], where: tuple[int, ...], heads: tuple[str, ...]) -> None:
        for index, block in enumerate(blocks):
            here, head = (*where, index), (*heads, _head(block))
            capabilities = block.attributes.get("capabilities", ())
            for capability in (capabilities,) if isinstance(capabilities, str) else capabilities:
                out.append(Rule(policy, here, capability, f"{' '.join(head)} {json.dumps(capability)}"))
            if "policy" in block.attributes:
                word = block.attributes["policy"]
                out.append(Rule(policy, here, None, f"{' '.join(head)} policy = {json.dumps(word)}"))
            walk(block.blocks, here, head)

    walk(read_rules(text, f"{policy}.policy.hcl"), (), ())
    return out


def _render(blocks: tuple[RuleBlock, ...], indent: str = "") -> str:
    lines: list[str] = []
    for block in blocks:
        lines.append(f"{indent}{_head(block)} {{")
        for name, value in block.attributes.items():
            lines.append(f"{indent}  {name} = {json.dumps(value if isinstance(value, str) else list(value))}")
        if block.blocks:
            lines.append(_render(block.blocks, indent + "  "))
        lines.append(f"{indent}}}")
    return "\n".join(lines)


def _strip(blocks: tuple[RuleBlock, ...], rule: Rule, depth: int = 0) -> tuple[RuleBlock, ...]:
    out: list[RuleBlock] = []
    for index, block in enumerate(blocks):
        if index != rule.where[depth]:
            out.append(block)
            continue
        if depth + 1 < len(rule.where):
            out.append(
                RuleBlock(block.type, block.labels, block.attributes, _strip(block.blocks, rule, depth + 1))
            )
        elif rule.capability is not None:
            kept = tuple(c for c in block.attributes["capabilities"] if c != rule.capability)
            attributes = {**block.attributes, "capabilities": kept}
            if kept or "policy" in attributes or block.blocks:
                out.append(RuleBlock(block.type, block.labels, attributes, block.blocks))
        # else: the whole block goes
    return tuple(out)


def without(text: str, rule: Rule) -> str:
    """The policy text with ``rule`` taken out, everything else as it was."""
    return _render(_strip(read_rules(text, f"{rule.policy}.policy.hcl"), rule)) + "\n"
