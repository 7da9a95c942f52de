"""Reading catalog YAML safely, with the position of every key and value.

Owns the step from text to plain Python data (dicts, lists, scalars) plus a
``SourceMap`` that tells where each path came from. It refuses what PyYAML would
otherwise let through silently or dangerously: duplicate keys (PyYAML keeps the
last one), tags that construct objects, alias bombs (checked by counting the
expanded size on the node graph before anything is built, so a billion laughs
costs microseconds, not gigabytes), runaway nesting and oversized input.

It parses text; it does not open files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from llmgw.core.diagnostics import Diagnostic, Position, Severity, YamlPath

try:  # libyaml's parser is ~10x faster; the pure-Python one behaves the same
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

# Tag given to plain (unquoted) scalars while composing; the builder resolves
# them, with a cache, since most scalars in a large catalog repeat.
_PLAIN = "tag:llmgw,2026:plain"


class _Loader(_BaseLoader):
    """Composes without resolving each plain scalar in Python (half of PyYAML's load time)."""

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return _PLAIN
        return str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class ReadLimits:
    # A catalog of 2,000 models is about 1 MB; 16 MiB leaves room without
    # letting a mistaken upload of a weights file reach the parser.
    max_bytes: int = 16 * 1024 * 1024
    # Nodes after alias expansion. 2,000 models need about 100,000.
    max_nodes: int = 2_000_000
    max_depth: int = 64


DEFAULT_LIMITS = ReadLimits()

PlainData = dict[str, "PlainData"] | list["PlainData"] | str | int | float | bool | None


class SourceMap:
    """Where each path's key and value start in the text.

    Looked up only when there is something to report, so it keeps the node
    graph and walks it on demand instead of recording a position per node.
    """

    def __init__(self, root: yaml.Node | None = None) -> None:
        self._root = root
        self._renames: dict[YamlPath, YamlPath] = {}
        self._index: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]] = {}

    def rename(self, old: YamlPath, new: YamlPath) -> None:
        """A repair renamed a key: report the new path at the old key's place."""
        self._renames[new] = old

    def key_position(self, path: YamlPath) -> Position | None:
        """The key of the entry at ``path``, else its value, else the nearest ancestor's."""
        found = self._find(path)
        if found is None:
            return None
        key_node, value_node, exact = found
        node = key_node if exact and key_node is not None else value_node
        return _position(node)

    def value_position(self, path: YamlPath) -> Position | None:
        found = self._find(path)
        if found is None:
            return None
        key_node, value_node, _ = found
        return _position(value_node if value_node is not None else key_node)

    def _find(self, path: YamlPath) -> tuple[yaml.Node | None, yaml.Node, bool] | None:
        """(key node, value node, whether the whole path was found) of the deepest match."""
        if self._root is None:
            return None
        path = self._renames.get(path, path)
        key_node: yaml.Node | None = None
        node: yaml.Node = self._root
        for element in path:
            entry = _child(node, element, self._index)
            if entry is None:
                return key_node, node, False
            key_node, node = entry
        return key_node, node, True


@dataclass(frozen=True, slots=True)
class ReadResult:
    data: PlainData
    source_map: SourceMap
    diagnostics: tuple[Diagnostic, ...]


class _Refused(Exception):
    def __init__(self, message: str, position: Position | None, path: YamlPath = ()) -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        self.path = path


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"

# Only these constructors are reachable; everything else (binary, sets,
# omaps, python/* tags) is refused by tag.
_SCALAR_CONSTRUCTOR = yaml.SafeLoader("")
_RESOLVER = yaml.SafeLoader("")
_IMPLICIT_TAGS = frozenset({_INT, _FLOAT, _BOOL, _NULL, _TIMESTAMP})


def _child(
    node: yaml.Node, element: str | int, index: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]]
) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.SequenceNode) and isinstance(element, int):
        return (None, node.value[element]) if 0 <= element < len(node.value) else None
    if not isinstance(node, yaml.MappingNode):
        return None
    entries = index.get(id(node))
    if entries is None:
        entries = index[id(node)] = {}
        merges = []
        for key_node, value_node in node.value:
            if _is_merge_key(key_node):
                merges.append(value_node)
            else:
                entries.setdefault(str(key_node.value), (key_node, value_node))
        for merged in merges:
            for source in merged.value if isinstance(merged, yaml.SequenceNode) else [merged]:
                if isinstance(source, yaml.MappingNode):
                    for key_node, value_node in source.value:
                        entries.setdefault(str(key_node.value), (key_node, value_node))
    return entries.get(str(element))


def _is_merge_key(node: yaml.Node) -> bool:
    return node.tag == _MERGE or (node.tag == _PLAIN and node.value == "<<")


def _position(node: yaml.Node) -> Position:
    mark = node.start_mark
    return Position(mark.line + 1, mark.column + 1)


def read_yaml(text: str, *, filename: str, limits: ReadLimits = DEFAULT_LIMITS) -> ReadResult:
    """Parse one YAML document into plain data. Problems come back as diagnostics."""

    def refused(message: str, position: Position | None = None, path: YamlPath = ()) -> ReadResult:
        diagnostic = Diagnostic(Severity.ERROR, path, message, filename, position)
        return ReadResult(None, SourceMap(), (diagnostic,))

    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > limits.max_bytes:
        return refused(f"the catalog is {size} bytes; the limit is {limits.max_bytes}")
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(mark.line + 1, mark.column + 1) if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        return refused(f"YAML syntax: {problem}", position)
    except yaml.YAMLError as exc:
        return refused(f"YAML syntax: {exc}")
    if root is None:
        return ReadResult(None, SourceMap(), ())
    try:
        if "&" in text:  # without anchors there are no aliases to expand
            _check_expanded_size(root, limits)
        builder = _Builder(limits, filename)
        data = builder.build(root, (), 0)
    except _Refused as exc:
        return refused(exc.message, exc.position, exc.path)
    return ReadResult(data, SourceMap(root), tuple(builder.diagnostics))


def _check_expanded_size(root: yaml.Node, limits: ReadLimits) -> None:
    """Count the nodes the document would have with every alias expanded.

    Memoised per node, so shared subtrees cost one visit: linear in the text,
    whatever the expansion.
    """
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:
            raise _Refused(
                "a YAML alias refers to the node that contains it (recursive alias)", _position(node)
            )
        if depth > limits.max_depth:
            raise _Refused(f"the document nests deeper than {limits.max_depth} levels", _position(node))
        in_progress.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                total += size(child, depth + 1)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                total += size(key_node, depth + 1) + size(value_node, depth + 1)
        if total > limits.max_nodes:
            raise _Refused(
                f"the document expands to more than {limits.max_nodes} nodes through YAML aliases "
                "(an alias bomb?); write the values out or use fewer aliases",
                _position(node),
            )
        in_progress.discard(key)
        sizes[key] = total
        return total

    size(root, 0)


class _Builder:
    def __init__(self, limits: ReadLimits, filename: str) -> None:
        self.limits = limits
        self.filename = filename
        self.diagnostics: list[Diagnostic] = []
        self._plain_values: dict[str, PlainData] = {}

    def build(self, node: yaml.Node, path: YamlPath, depth: int) -> PlainData:
        if depth > self.limits.max_depth:
            raise _Refused(
                f"the document nests deeper than {self.limits.max_depth} levels", _position(node), path
            )
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                raise _Refused(f"YAML tag {node.tag} is not allowed in a catalog", _position(node), path)
            return [self.build(child, (*path, index), depth + 1) for index, child in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode):
            if node.tag != _MAP:
                raise _Refused(f"YAML tag {node.tag} is not allowed in a catalog", _position(node), path)
            return self._mapping(node, path, depth)
        raise _Refused("unsupported YAML node", _position(node), path)  # pragma: no cover

    def _scalar(self, node: yaml.ScalarNode, path: YamlPath) -> PlainData:
        tag = node.tag
        if tag == _PLAIN:
            text = str(node.value)
            try:
                return self._plain_values[text]
            except KeyError:
                value = self._plain_values[text] = self._resolve_plain(node)
                return value
        if tag == _STR:
            return str(node.value)
        if tag in _IMPLICIT_TAGS:  # an explicit !!int, !!bool... on a quoted scalar
            return self._construct(node, tag)
        raise _Refused(f"YAML tag {tag} is not allowed in a catalog", _position(node), path)

    def _resolve_plain(self, node: yaml.ScalarNode) -> PlainData:
        tag = _RESOLVER.resolve(yaml.ScalarNode, node.value, (True, False))  # type: ignore[no-untyped-call]
        if tag in (_STR, _MERGE):
            return str(node.value)
        return self._construct(node, tag)

    @staticmethod
    def _construct(node: yaml.ScalarNode, tag: str) -> PlainData:
        if tag == _TIMESTAMP:
            return str(node.value)  # a date-looking description stays the text written
        typed = yaml.ScalarNode(tag, node.value, node.start_mark, node.end_mark, node.style)
        value: PlainData = _SCALAR_CONSTRUCTOR.construct_object(typed)
        return value

    def _mapping(self, node: yaml.MappingNode, path: YamlPath, depth: int) -> dict[str, PlainData]:
        explicit: dict[str, PlainData] = {}
        first_seen: dict[str, yaml.Node] = {}
        merged: dict[str, PlainData] = {}
        for key_node, value_node in node.value:
            if _is_merge_key(key_node):
                self._merge_into(merged, value_node, path, depth)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(
                    "mapping keys must be plain names, not lists or mappings", _position(key_node), path
                )
            # Keys are names; the text as written is the name, even when YAML
            # would read it as a number or a boolean (a model called 2024, a key yes).
            key = str(key_node.value)
            if key in first_seen:
                first = _position(first_seen[key])
                self.diagnostics.append(
                    Diagnostic(
                        Severity.ERROR,
                        (*path, key),
                        f'duplicate key "{key}" (first defined at line {first.line}); '
                        "YAML would silently keep only the last one",
                        self.filename,
                        _position(key_node),
                    )
                )
                continue
            first_seen[key] = key_node
            explicit[key] = self.build(value_node, (*path, key), depth + 1)
        if not merged:
            return explicit
        return {**merged, **explicit}

    def _merge_into(
        self, target: dict[str, PlainData], value_node: yaml.Node, path: YamlPath, depth: int
    ) -> None:
        """YAML merge keys (``<<: *defaults``): explicit keys win, earlier merges win over later."""
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                raise _Refused("a merge key (<<) must refer to a mapping", _position(source), path)
            merged = self._mapping(source, path, depth + 1)
            for key, value in merged.items():
                target.setdefault(key, value)
