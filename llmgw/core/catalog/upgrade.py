"""``llmgw catalog upgrade``: write the loader's repairs back into the operator's file.

Round-trips with ruamel.yaml so comments, key order and quoting survive; only
the repaired keys and values change. Pure: text in, text out.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.util import load_yaml_guess_indent

from llmgw.core.catalog.loading import LoadResult, load_catalog
from llmgw.core.catalog.repairs import Repair, RepairKind
from llmgw.core.catalog.security import SecurityPolicy


@dataclass(frozen=True, slots=True)
class UpgradeResult:
    text: str  # the upgraded text (the input unchanged when there was nothing to do)
    changes: tuple[Repair, ...]
    load: LoadResult  # the load of the original text, with its diagnostics


def upgrade_catalog(text: str, *, filename: str, policy: SecurityPolicy) -> UpgradeResult:
    load = load_catalog(text, filename=filename, policy=policy)
    if not load.repairs:
        return UpgradeResult(text, (), load)
    _, sequence_indent, block_sequence_indent = load_yaml_guess_indent(text)
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap the operator's long lines
    # Keep the operator's indentation of lists (ruamel's default would re-indent them).
    yaml.indent(
        mapping=block_sequence_indent or 2, sequence=sequence_indent or 2, offset=block_sequence_indent or 0
    )
    document = yaml.load(text)
    for repair in load.repairs:
        _apply(document, repair)
    out = io.StringIO()
    yaml.dump(document, out)
    return UpgradeResult(out.getvalue(), load.repairs, load)


def _node_at(document: Any, path: tuple[str | int, ...]) -> Any:
    node = document
    for element in path:
        node = node[element]
    return node


def _apply(document: Any, repair: Repair) -> None:
    if repair.kind is RepairKind.REPLACE_VALUE:
        parent = _node_at(document, repair.path[:-1])
        parent[repair.path[-1]] = repair.new
        return
    mapping = _node_at(document, repair.path)
    assert isinstance(mapping, CommentedMap)  # the loader only repairs mappings it read
    position = list(mapping.keys()).index(repair.old)
    value = mapping[repair.old]
    comment = mapping.ca.items.pop(repair.old, None)
    del mapping[repair.old]
    mapping.insert(position, repair.new, value)
    if comment is not None:
        mapping.ca.items[repair.new] = comment
