"""Consul's ``?filter=`` expressions (go-bexpr), the subset clients write.

Owns parsing an expression against the fields of the result type (from
consul-api-fields.json, so ``ServiceMeta`` is a valid selector on
/v1/catalog/service but not on /v1/health/service, as in Consul) and evaluating
it on rendered JSON documents.

Supported: ``Sel == "v"``, ``Sel != "v"``, ``"v" in Sel``, ``"v" not in Sel``,
``Sel is empty``, ``Sel is not empty``, ``Sel matches "re"``, ``Sel not matches
"re"``, ``Sel contains "v"``, ``Sel not contains "v"``, joined with ``and``,
``or``, ``not`` and parentheses; values double-quoted, backquoted or bare.
Selectors are dotted (``Service.Meta.model``) or indexed (``Service.Meta["a.b"]``).
Anything else is refused with 400 and Consul's message prefix, never guessed at.

Must not: know about HTTP or the store.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.apispec import Kind, go_type, struct
from llmgw.devcluster.consul.model import ConsulError

Doc = object
Predicate = Callable[[Doc], bool]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<lparen>\()|(?P<rparen>\))|
        (?P<op>==|!=)|
        (?P<dq>"(?:[^"\\]|\\.)*")|(?P<bq>`[^`]*`)|
        (?P<index>\[\s*"(?:[^"\\]|\\.)*"\s*\])|
        (?P<word>[A-Za-z0-9_\-./:*@]+)
    )""",
    re.VERBOSE,
)


class FilterError(ConsulError):
    def __init__(self, detail: str) -> None:
        super().__init__(400, f"Failed to create boolean expression evaluator: {detail}")


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str


def _unquote(text: str) -> str:
    if text.startswith('"'):
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    if text.startswith("`"):
        return text[1:-1]
    return text


def _tokens(expr: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise FilterError(f"1:{pos + 1}: syntax error near {expr[pos : pos + 10]!r}")
        kind = m.lastgroup or ""
        out.append(_Tok(kind, m.group(kind)))
        pos = m.end()
    return out


def _validate_selector(path: list[str], root: str) -> None:
    """Raise unless ``path`` names a field of ``root`` (maps accept any key)."""
    t = go_type(root, "consul").deref()
    if t.kind is Kind.SLICE and t.elem is not None:
        t = t.elem.deref()
    for i, part in enumerate(path):
        if t.kind is Kind.MAP:
            if t.elem is not None:
                t = t.elem.deref()
            continue
        if t.kind is not Kind.STRUCT:
            raise FilterError(f'Selector "{".".join(path)}" is not valid')
        spec = struct(t.name, "consul")
        if part not in spec.fields:
            raise FilterError(f'Selector "{".".join(path[: i + 1])}" is not valid')
        t = go_type(spec.fields[part].go_type, "consul").deref()


def _resolve(doc: Doc, path: list[str]) -> tuple[bool, object]:
    cur: object = doc
    for part in path:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return False, None
    return True, cur


def _scalar_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class _Parser:
    def __init__(self, tokens: list[_Tok], root: str) -> None:
        self.toks = tokens
        self.pos = 0
        self.root = root

    def peek(self, offset: int = 0) -> _Tok | None:
        i = self.pos + offset
        return self.toks[i] if i < len(self.toks) else None

    def word(self, offset: int = 0) -> str:
        t = self.peek(offset)
        return t.text.lower() if t is not None and t.kind == "word" else ""

    def take(self) -> _Tok:
        t = self.peek()
        if t is None:
            raise FilterError("unexpected end of expression")
        self.pos += 1
        return t

    def parse(self) -> Predicate:
        pred = self.or_()
        if self.peek() is not None:
            raise FilterError(f"syntax error near {self.peek().text!r}")  # type: ignore[union-attr]
        return pred

    def or_(self) -> Predicate:
        left = self.and_()
        while self.word() == "or":
            self.take()
            right = self.and_()
            left = (lambda a, b: lambda d: a(d) or b(d))(left, right)
        return left

    def and_(self) -> Predicate:
        left = self.not_()
        while self.word() == "and":
            self.take()
            right = self.not_()
            left = (lambda a, b: lambda d: a(d) and b(d))(left, right)
        return left

    def not_(self) -> Predicate:
        if self.word() == "not" and self.word(1) not in ("in", "matches", "contains"):
            self.take()
            inner = self.not_()
            return lambda d: not inner(d)
        return self.primary()

    def primary(self) -> Predicate:
        t = self.peek()
        if t is not None and t.kind == "lparen":
            self.take()
            inner = self.or_()
            if self.take().kind != "rparen":
                raise FilterError("missing ')'")
            return inner
        return self.match()

    def value(self) -> str:
        t = self.take()
        if t.kind not in ("dq", "bq", "word"):
            raise FilterError(f"expected a value, got {t.text!r}")
        return _unquote(t.text)

    def selector(self) -> list[str]:
        t = self.take()
        if t.kind != "word":
            raise FilterError(f"expected a selector, got {t.text!r}")
        path = t.text.split(".")
        while (nxt := self.peek()) is not None and nxt.kind == "index":
            self.take()
            path.append(_unquote(nxt.text[1:-1].strip()))
        _validate_selector(path, self.root)
        return path

    def match(self) -> Predicate:
        t = self.peek()
        quoted_first = t is not None and t.kind in ("dq", "bq")
        bare_value_first = self.word(1) == "in" or (self.word(1) == "not" and self.word(2) == "in")
        if quoted_first or bare_value_first:
            val = self.value()
            negate = self.word() == "not"
            if negate:
                self.take()
            if self.word() != "in":
                raise FilterError("expected 'in' after a value")
            self.take()
            path = self.selector()
            return self._contains(path, val, negate)
        path = self.selector()
        op = self.peek()
        if op is None:
            raise FilterError("expected an operator after the selector")
        if op.kind == "op":
            self.take()
            val = self.value()
            eq = op.text == "=="

            def compare(d: Doc) -> bool:
                found, got = _resolve(d, path)
                same = (
                    found
                    and not isinstance(got, dict | list)
                    and got is not None
                    and _scalar_text(got) == val
                )
                return same if eq else not same

            return compare
        w = self.word()
        if w == "is":
            self.take()
            negate = self.word() == "not"
            if negate:
                self.take()
            if self.word() != "empty":
                raise FilterError("expected 'empty' after 'is'")
            self.take()

            def empty(d: Doc) -> bool:
                _, got = _resolve(d, path)
                is_empty = got is None or (isinstance(got, str | list | dict) and len(got) == 0)
                return not is_empty if negate else is_empty

            return empty
        negate = w == "not"
        if negate:
            self.take()
            w = self.word()
        if w in ("matches", "contains"):
            self.take()
            val = self.value()
            if w == "contains":
                return self._contains(path, val, negate)
            try:
                pattern = re.compile(val)
            except re.error as exc:
                raise FilterError(f"invalid regular expression {val!r}: {exc}") from None

            def matches(d: Doc) -> bool:
                found, got = _resolve(d, path)
                hit = found and isinstance(got, str) and pattern.search(got) is not None
                return not hit if negate else hit

            return matches
        raise FilterError(f"unsupported operator {op.text!r}")

    @staticmethod
    def _contains(path: list[str], val: str, negate: bool) -> Predicate:
        def contains(d: Doc) -> bool:
            _, got = _resolve(d, path)
            if isinstance(got, list):
                hit = any(_scalar_text(x) == val for x in got)
            elif isinstance(got, dict | str):
                hit = val in got
            else:
                hit = False
            return not hit if negate else hit

        return contains


def compile_filter(expr: str, root: str) -> Predicate:
    """A predicate over rendered documents of Go type ``root`` (e.g. ``ServiceEntry``);
    raises :class:`FilterError` (400) for anything it cannot read."""
    toks = _tokens(expr)
    if not toks:
        return lambda _d: True
    return _Parser(toks, root).parse()
