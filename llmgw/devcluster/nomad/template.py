"""A consul-template subset for ``template`` blocks: parse once, render against Consul data.

Owns: Go text/template syntax as consul-template uses it — text and ``{{ }}`` actions
with ``{{-``/``-}}`` trimming and comments, ``if``/``else if``/``else``/``end``,
``range`` (with ``$i, $x :=``) and ``with`` (both with ``else``), variables,
pipelines, parentheses, fields such as ``.Address`` ``.Port`` ``.ServiceMeta.k`` — and
the functions ``service`` (``"name"``, ``"tag.name"``, ``"name|any"``,
``"name|passing,warning"``), ``key``, ``keyOrDefault``, ``nomadVar`` (``"path"``,
``"path@namespace"``: the variable's items, read as the task's workload identity),
``env``, ``len``, ``index``, ``eq``, ``gt``, ``join``: what llmgw's templates,
``ops/llmgw.nomad.hcl`` and the tests call. consul-template has many more; any
other name fails as Go's text/template fails a function it was not given:
``function "toUpper" not defined`` (``text/template/parse/parse.go``), followed by
the list the stand-in has.

Rendering is synchronous: lookups go through a ``DataSource``; an unknown dependency
is recorded (``Render.missing``) so the caller can fetch it and render again. A
``service`` with no healthy instance renders empty (as Nomad does); a missing ``key``
keeps the template unrendered (consul-template blocks on it); so does a missing
``nomadVar`` (``VariableMissing``), while one the workload may not read is an error
(``VariableDenied``).

Anything else is a ``TemplateError`` naming what is unsupported.

Must not: do I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class TemplateError(Exception):
    """The template cannot be parsed or executed by the dev stand-in."""


class NotReady(Exception):
    """A dependency is not available yet (a ``key`` that does not exist)."""


class VariableMissing(NotReady):
    """A ``nomadVar`` path with no variable: consul-template waits for it to be written."""

    def __init__(self, path: str, namespace: str) -> None:
        super().__init__(f"nomad.var.block({path}@{namespace})")
        self.path = path
        self.namespace = namespace


class VariableDenied(TemplateError):
    """A ``nomadVar`` path the task's workload identity may not read (Nomad answers 403)."""


@dataclass(frozen=True)
class ServiceQuery:
    name: str
    tag: str = ""
    any_status: bool = False

    @staticmethod
    def parse(text: str) -> ServiceQuery:
        status = ""
        if "|" in text:
            text, status = text.split("|", 1)
        if "@" in text:
            text = text.split("@", 1)[0]  # one datacenter in the dev cluster
        tag = ""
        if "." in text:
            tag, text = text.rsplit(".", 1)
        statuses = {s.strip() for s in status.split(",") if s.strip()}
        return ServiceQuery(text, tag, any_status=bool(statuses - {"passing"}))


@dataclass(frozen=True)
class KeyQuery:
    key: str


@dataclass(frozen=True)
class VarQuery:
    """A ``nomadVar`` read: watched so that a changed variable re-renders the template."""

    path: str
    namespace: str | None = None


Dependency = ServiceQuery | KeyQuery | VarQuery


def describe(dep: Dependency) -> str:
    """A dependency as consul-template names it in Nomad's events and errors
    (``dependency/health_service.go`` and ``kv_get.go``, ``String``)."""
    if isinstance(dep, ServiceQuery):
        name = f"{dep.tag}.{dep.name}" if dep.tag else dep.name
        return f"health.service({name}{'' if dep.any_status else '|passing'})"
    if isinstance(dep, KeyQuery):
        return f"kv.block({dep.key})"
    return f"nomad.var.block({dep.path})"


class DataSource(Protocol):
    def service(self, query: ServiceQuery) -> list[dict[str, Any]] | None: ...
    def key(self, key: str) -> tuple[bool, str] | None: ...  # (exists, value); None = not fetched
    def env(self, name: str) -> str: ...
    # A Nomad variable's items; None when it does not exist. Raises VariableDenied when the
    # workload may not read it. namespace None is the task's own.
    def variable(self, path: str, namespace: str | None) -> dict[str, str] | None: ...


class Record(dict[str, Any]):
    """A struct-like value: a missing field is an error, as in Go."""


# ---------------------------------------------------------------------------
# Lexing

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*")
      | (?P<raw>`[^`]*`)
      | (?P<num>-?\d+(?:\.\d+)?)
      | (?P<decl>:=)
      | (?P<assign>=)
      | (?P<pipe>\|)
      | (?P<lp>\()
      | (?P<rp>\))
      | (?P<comma>,)
      | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
      | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str


def _lex_action(src: str) -> list[Tok]:
    toks: list[Tok] = []
    pos = 0
    src = src.rstrip()
    while pos < len(src):
        match = _TOKEN.match(src, pos)
        if not match or match.end() == pos:
            raise TemplateError(f"unexpected {src[pos:].strip()[:20]!r} in action {{{{{src}}}}}")
        kind = match.lastgroup or ""
        toks.append(Tok(kind, match.group(kind)))
        pos = match.end()
        if not src[pos:].strip():
            break
    return toks


def _split(source: str, left: str, right: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", s)] with trim markers applied."""
    parts: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    while True:
        start = source.find(left, pos)
        if start < 0:
            text = source[pos:]
            parts.append(("text", text.lstrip() if trim_next else text))
            break
        text = source[pos:start]
        if trim_next:
            text = text.lstrip()
        inner_start = start + len(left)
        trim_prev = source.startswith("- ", inner_start) or source.startswith("-\n", inner_start)
        if trim_prev:
            text = text.rstrip()
            inner_start += 1
        parts.append(("text", text))
        end = source.find(right, inner_start)
        if end < 0:
            raise TemplateError(f"unclosed action starting at offset {start}")
        inner = source[inner_start:end]
        trim_next = inner.endswith(" -") or inner.endswith("\n-")
        if trim_next:
            inner = inner[:-1]
        parts.append(("action", inner.strip()))
        pos = end + len(right)
    return parts


# ---------------------------------------------------------------------------
# Parsing


@dataclass
class Operand:
    kind: str  # field | var | str | num | bool | nil | func | sub
    value: Any
    fields: tuple[str, ...] = ()


@dataclass
class Pipeline:
    decl: list[str] = field(default_factory=list)
    assign: bool = False  # "=" rather than ":="
    cmds: list[list[Operand]] = field(default_factory=list)


@dataclass
class Node:
    kind: str  # text | action | if | range | with
    text: str = ""
    pipe: Pipeline | None = None
    body: list[Node] = field(default_factory=list)
    branches: list[tuple[Pipeline, list[Node]]] = field(default_factory=list)
    else_body: list[Node] = field(default_factory=list)


def _parse_pipeline(toks: list[Tok]) -> Pipeline:
    pipe = Pipeline()
    i = 0
    # Declarations: $x := ..., $i, $e := ..., $x = ...
    decl_end = next((k for k, t in enumerate(toks) if t.kind in ("decl", "assign")), -1)
    if decl_end > 0 and all(t.kind in ("var", "comma") for t in toks[:decl_end]):
        pipe.decl = [t.text for t in toks[:decl_end] if t.kind == "var"]
        pipe.assign = toks[decl_end].kind == "assign"
        i = decl_end + 1
    cmd: list[Operand] = []
    while i < len(toks):
        tok = toks[i]
        if tok.kind == "pipe":
            if not cmd:
                raise TemplateError("missing command before '|'")
            pipe.cmds.append(cmd)
            cmd = []
            i += 1
            continue
        if tok.kind == "lp":
            depth = 1
            j = i + 1
            while j < len(toks) and depth:
                depth += {"lp": 1, "rp": -1}.get(toks[j].kind, 0)
                j += 1
            if depth:
                raise TemplateError("unclosed '('")
            inner = toks[i + 1 : j - 1]
            sub = _parse_pipeline(inner)
            fields: tuple[str, ...] = ()
            cmd.append(Operand("sub", sub, fields))
            i = j
            continue
        cmd.append(_operand(tok))
        i += 1
    if cmd:
        pipe.cmds.append(cmd)
    if not pipe.cmds:
        raise TemplateError("empty pipeline")
    return pipe


def _operand(tok: Tok) -> Operand:
    if tok.kind == "str":
        return Operand("str", json.loads(tok.text))
    if tok.kind == "raw":
        return Operand("str", tok.text[1:-1])
    if tok.kind == "num":
        return Operand("num", float(tok.text) if "." in tok.text else int(tok.text))
    if tok.kind == "field":
        return Operand("field", None, tuple(p for p in tok.text.split(".") if p))
    if tok.kind == "var":
        name, *rest = tok.text.split(".")
        return Operand("var", name, tuple(rest))
    if tok.kind == "ident":
        if tok.text in ("true", "false"):
            return Operand("bool", tok.text == "true")
        if tok.text == "nil":
            return Operand("nil", None)
        if "." in tok.text:
            raise TemplateError(f"unsupported field access on {tok.text!r}")
        return Operand("func", tok.text)
    raise TemplateError(f"unexpected {tok.text!r}")


_KEYWORDS = ("if", "else", "end", "range", "with", "define", "template", "block", "break", "continue")


def parse(source: str, left: str = "{{", right: str = "}}") -> list[Node]:
    parts = _split(source, left, right)
    pos = 0

    def parse_list(stop: tuple[str, ...]) -> tuple[list[Node], str, list[Tok]]:
        nonlocal pos
        nodes: list[Node] = []
        while pos < len(parts):
            kind, text = parts[pos]
            pos += 1
            if kind == "text":
                if text:
                    nodes.append(Node("text", text=text))
                continue
            if text.startswith("/*"):
                if not text.endswith("*/"):
                    raise TemplateError("unclosed comment")
                continue
            toks = _lex_action(text)
            if not toks:
                raise TemplateError("empty action")
            head = toks[0]
            if head.kind == "ident" and head.text in ("end", "else"):
                if head.text not in stop:
                    raise TemplateError(f"unexpected {{{{{head.text}}}}}")
                return nodes, head.text, toks[1:]
            if head.kind == "ident" and head.text in ("if", "range", "with"):
                nodes.append(parse_control(head.text, toks[1:]))
                continue
            if head.kind == "ident" and head.text in _KEYWORDS:
                raise TemplateError(f"{{{{{head.text}}}}} is not supported by the dev stand-in")
            nodes.append(Node("action", pipe=_parse_pipeline(toks)))
        if stop:
            raise TemplateError(f"missing {{{{end}}}} (expected one of {', '.join(stop)})")
        return nodes, "", []

    def parse_control(kind: str, toks: list[Tok]) -> Node:
        node = Node(kind)
        pipe = _parse_pipeline(toks)
        body, ended, rest = parse_list(("end", "else"))
        node.branches.append((pipe, body))
        while ended == "else":
            if rest and rest[0].kind == "ident" and rest[0].text == "if" and kind == "if":
                pipe = _parse_pipeline(rest[1:])
                body, ended, rest = parse_list(("end", "else"))
                node.branches.append((pipe, body))
                continue
            if rest:
                raise TemplateError(f"unsupported {{{{else {' '.join(t.text for t in rest)}}}}}")
            node.else_body, ended, rest = parse_list(("end",))
        return node

    nodes, _, _ = parse_list(())
    return nodes


# ---------------------------------------------------------------------------
# Executing


def truthy(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, (str, list, dict, tuple)):
        return len(value) > 0
    return True


def to_text(value: Any) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(to_text(v) for v in value) + "]"
    if isinstance(value, dict) and not isinstance(value, Record):
        return "map[" + " ".join(f"{k}:{to_text(v)}" for k, v in sorted(value.items())) + "]"
    return str(value)


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, bool) or isinstance(b, bool):
        raise TemplateError("incompatible types for comparison")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return (a > b) - (a < b)
    if isinstance(a, str) and isinstance(b, str):
        return (a > b) - (a < b)
    raise TemplateError(f"incompatible types for comparison: {type(a).__name__} and {type(b).__name__}")


@dataclass
class Render:
    output: str
    missing: set[Dependency]
    used: set[Dependency]


class _Exec:
    def __init__(self, data: DataSource) -> None:
        self.data = data
        self.missing: set[Dependency] = set()
        self.used: set[Dependency] = set()
        self.funcs: dict[str, Callable[..., Any]] = {
            "service": self.f_service,
            "key": self.f_key,
            "keyOrDefault": self.f_key_or_default,
            "nomadVar": self.f_nomad_var,
            "env": lambda name: self.data.env(str(name)),
            "len": lambda v: len(v) if v is not None else 0,
            "index": self.f_index,
            "eq": lambda a, *bs: any(a == b for b in bs),
            "gt": lambda a, b: _compare(a, b) > 0,
            "join": lambda sep, items: str(sep).join(to_text(i) for i in (items or [])),
        }

    def f_service(self, text: str, *_: Any) -> list[Record]:
        query = ServiceQuery.parse(str(text))
        self.used.add(query)
        entries = self.data.service(query)
        if entries is None:
            self.missing.add(query)
            return []
        return [Record(e) for e in entries]

    def _key(self, key: str) -> tuple[bool, str] | None:
        query = KeyQuery(str(key))
        self.used.add(query)
        found = self.data.key(query.key)
        if found is None:
            self.missing.add(query)
        return found

    def f_key(self, key: str) -> str:
        found = self._key(key)
        if found is None:
            return ""
        exists, value = found
        if not exists:
            raise NotReady(f"key {key!r} does not exist in Consul yet")
        return value

    def f_key_or_default(self, key: str, default: str) -> str:
        found = self._key(key)
        if found is None or not found[0]:
            return str(default)
        return found[1]

    def f_nomad_var(self, ref: str) -> dict[str, str]:
        path, _, namespace = str(ref).partition("@")
        self.used.add(VarQuery(path, namespace or None))
        items = self.data.variable(path, namespace or None)
        if items is None:
            raise VariableMissing(path, namespace or "default")
        return dict(items)

    @staticmethod
    def f_index(container: Any, *keys: Any) -> Any:
        value = container
        for key in keys:
            if isinstance(value, dict):
                value = value.get(key, "" if not isinstance(value, Record) else None)
            elif isinstance(value, list):
                value = value[int(key)]
            else:
                raise TemplateError(f"can't index item of type {type(value).__name__}")
        return value

    # -- evaluation ---------------------------------------------------

    def run(self, nodes: list[Node], dot: Any, scope: list[dict[str, Any]], out: list[str]) -> None:
        for node in nodes:
            if node.kind == "text":
                out.append(node.text)
            elif node.kind == "action":
                assert node.pipe is not None
                value = self.pipeline(node.pipe, dot, scope)
                if not node.pipe.decl:
                    out.append(to_text(value))
            elif node.kind == "if":
                for pipe, body in node.branches:
                    if truthy(self.pipeline(pipe, dot, scope)):
                        self.run(body, dot, [*scope, {}], out)
                        break
                else:
                    self.run(node.else_body, dot, [*scope, {}], out)
            elif node.kind == "with":
                pipe, body = node.branches[0]
                value = self.pipeline(pipe, dot, scope, declare=False)
                if truthy(value):
                    inner = [*scope, {}]
                    self._declare(pipe, value, inner)
                    self.run(body, value, inner, out)
                else:
                    self.run(node.else_body, dot, [*scope, {}], out)
            elif node.kind == "range":
                pipe, body = node.branches[0]
                value = self.pipeline(pipe, dot, scope, declare=False)
                items: list[tuple[Any, Any]]
                if isinstance(value, dict):
                    items = [(k, value[k]) for k in sorted(value)]
                elif isinstance(value, list):
                    items = list(enumerate(value))
                elif value is None:
                    items = []
                else:
                    raise TemplateError(f"range can't iterate over {to_text(value)}")
                if not items:
                    self.run(node.else_body, dot, [*scope, {}], out)
                for key, item in items:
                    inner = [*scope, {}]
                    if len(pipe.decl) == 1:
                        inner[-1][pipe.decl[0]] = item
                    elif len(pipe.decl) == 2:
                        inner[-1][pipe.decl[0]] = key
                        inner[-1][pipe.decl[1]] = item
                    self.run(body, item, inner, out)

    def _declare(self, pipe: Pipeline, value: Any, scope: list[dict[str, Any]]) -> None:
        for name in pipe.decl:
            if pipe.assign:
                for frame in reversed(scope):
                    if name in frame:
                        frame[name] = value
                        break
                else:
                    raise TemplateError(f"undefined variable: {name}")
            else:
                scope[-1][name] = value

    def pipeline(self, pipe: Pipeline, dot: Any, scope: list[dict[str, Any]], declare: bool = True) -> Any:
        value: Any = None
        first = True
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, scope, None if first else (value,))
            first = False
        if declare and pipe.decl:
            self._declare(pipe, value, scope)
        return value

    def command(
        self, cmd: list[Operand], dot: Any, scope: list[dict[str, Any]], piped: tuple[Any] | None
    ) -> Any:
        head = cmd[0]
        if head.kind == "func":
            fn = self.funcs.get(str(head.value))
            if fn is None:
                raise TemplateError(
                    f'function "{head.value}" not defined (the dev stand-in supports '
                    f"{', '.join(sorted(self.funcs))})"
                )
            args = [self.operand(op, dot, scope) for op in cmd[1:]]
            if piped is not None:
                args.append(piped[0])
            try:
                return fn(*args)
            except (TemplateError, NotReady):
                raise
            except Exception as exc:
                raise TemplateError(f"error calling {head.value}: {exc}") from exc
        if len(cmd) > 1 or piped is not None:
            raise TemplateError(f"can't give argument to non-function {head.kind}")
        return self.operand(head, dot, scope)

    def operand(self, op: Operand, dot: Any, scope: list[dict[str, Any]]) -> Any:
        if op.kind in ("str", "num", "bool", "nil"):
            return op.value
        if op.kind == "field":
            return self.fields(dot, op.fields)
        if op.kind == "var":
            name = str(op.value)
            if name == "$":
                base = scope[0].get("$")
            else:
                for frame in reversed(scope):
                    if name in frame:
                        base = frame[name]
                        break
                else:
                    raise TemplateError(f"undefined variable: {name}")
            return self.fields(base, op.fields)
        if op.kind == "sub":
            return self.fields(self.pipeline(op.value, dot, scope), op.fields)
        if op.kind == "func":
            return self.command([op], dot, scope, None)
        raise TemplateError(f"unsupported operand {op.kind}")

    @staticmethod
    def fields(value: Any, names: tuple[str, ...]) -> Any:
        for name in names:
            if isinstance(value, Record):
                if name not in value:
                    raise TemplateError(f"can't evaluate field {name}")
                value = value[name]
            elif isinstance(value, Mapping):
                value = value.get(name, "")
            else:
                raise TemplateError(f"can't evaluate field {name} in type {type(value).__name__}")
        return value


def render(nodes: list[Node], data: DataSource) -> Render:
    ex = _Exec(data)
    out: list[str] = []
    ex.run(nodes, None, [{"$": None}], out)
    return Render("".join(out), ex.missing, ex.used)


def service_record(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A /v1/health/service entry as consul-template exposes it to a template."""
    node = entry.get("Node") or {}
    service = entry.get("Service") or {}
    checks = entry.get("Checks") or []
    statuses = [c.get("Status") for c in checks]
    status = "critical" if "critical" in statuses else "warning" if "warning" in statuses else "passing"
    return {
        "ID": service.get("ID", ""),
        "Name": service.get("Service", ""),
        "Address": service.get("Address") or node.get("Address", ""),
        "Port": int(service.get("Port") or 0),
        "Tags": list(service.get("Tags") or []),
        "ServiceMeta": dict(service.get("Meta") or {}),
        "Namespace": service.get("Namespace", "") or "",
        "Node": node.get("Node", ""),
        "NodeID": node.get("ID", ""),
        "NodeAddress": node.get("Address", ""),
        "NodeDatacenter": node.get("Datacenter", ""),
        "NodeMeta": dict(node.get("Meta") or {}),
        "Status": status,
        "Checks": checks,
        "Weights": service.get("Weights") or {},
    }
