"""HCL2 expressions as jobspec2 evaluates them: the node classes and their evaluation.

Owns the expression tree the parser builds (literals, templates, traversals,
operators, function calls, for-expressions, conditionals) and the value rules of
cty that matter for jobspecs: number/string/bool conversions, template rendering,
equality, and Nomad's fork of HCL that keeps a reference to an unknown variable
as literal ``${...}`` text so the Nomad client interpolates it at run time.

Values are plain Python: ``str``, ``int``/``float`` (numbers), ``bool``, ``None``
(null), ``list`` (tuples and lists), ``dict`` (objects and maps).

Must not: know about Nomad's job structure (that is :mod:`.decoding`), or read
files or the environment (jobspec2 on the server runs with file functions off).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from llmgw.apispec.jobspec.diagnostics import SyntaxProblem

if TYPE_CHECKING:
    from llmgw.apispec.jobspec.functions import Function

Value = object


class ConversionError(Exception):
    """A value does not convert to the wanted type; the message is cty's wording."""


_MISSING = object()


class Context:
    """What an expression can see: variables by root name, functions, and the unknown-reference rule.

    ``unknown_as_text`` is Nomad's fork of HCL: a root name that is not defined
    evaluates to the string ``${<source>}`` instead of failing. Variable defaults are
    evaluated without it (jobspec2 gives them no context at all).
    """

    __slots__ = ("functions", "hits", "unknown_as_text", "variables")

    def __init__(
        self,
        variables: dict[str, Value],
        functions: Mapping[str, Function],
        *,
        unknown_as_text: bool = True,
    ) -> None:
        self.variables = variables
        self.functions = functions
        self.unknown_as_text = unknown_as_text
        self.hits = 0  # how many unknown references were kept as text so far

    def child(self, extra: dict[str, Value]) -> Context:
        c = Context({**self.variables, **extra}, self.functions, unknown_as_text=self.unknown_as_text)
        c.hits = self.hits
        return c


# ---------------------------------------------------------------- value rules


def type_name(v: Value) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "tuple"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def normalize_number(n: int | float) -> int | float:
    """cty numbers are exact: 4/2 is the integer 2, so integral floats become ints."""
    if isinstance(n, float) and n.is_integer() and abs(n) < 2**63:
        return int(n)
    return n


def parse_number(text: str) -> int | float | None:
    """A number literal or numeric string as cty reads it, or None."""
    t = text.strip()
    if not t or t != text:
        return None
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return int(d)
    return float(d)


def number_text(n: int | float) -> str:
    if isinstance(n, int):
        return str(n)
    if math.isinf(n):
        return "+Inf" if n > 0 else "-Inf"
    r = repr(n)
    if "e" in r or "E" in r:
        return format(Decimal(r), "f")
    return r


def to_string(v: Value) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return number_text(v)
    raise ConversionError("string required")


def to_number(v: Value) -> int | float:
    if isinstance(v, bool):
        raise ConversionError("number required")
    if isinstance(v, int | float):
        return v
    if isinstance(v, str):
        n = parse_number(v)
        if n is None:
            raise ConversionError("a number is required")
        return n
    raise ConversionError("number required")


def to_bool(v: Value) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        if v == "true":
            return True
        if v == "false":
            return False
        raise ConversionError("a bool is required")
    raise ConversionError("bool required")


def equal(a: Value, b: Value) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def iterate(v: Value) -> list[tuple[Value, Value]]:
    """(key, value) pairs as cty iterates: tuples by index, objects and maps by sorted key."""
    if isinstance(v, list):
        return list(enumerate(v))
    if isinstance(v, dict):
        return [(k, v[k]) for k in sorted(v)]
    raise ConversionError(f"A {type_name(v)} value cannot be used as the collection in a 'for' expression.")


# ---------------------------------------------------------------- nodes


class Expr:
    """An expression: ``start`` is the offset HCL reports errors at (the start of the expression)."""

    __slots__ = ("start",)

    def __init__(self, start: int) -> None:
        self.start = start

    def eval(self, ctx: Context) -> Value:
        raise NotImplementedError

    def static_text(self) -> str | None:
        """The string this expression is when it is a plain literal string, else None."""
        return None


class Literal(Expr):
    __slots__ = ("value",)

    def __init__(self, start: int, value: Value) -> None:
        super().__init__(start)
        self.value = value

    def eval(self, ctx: Context) -> Value:
        return self.value


class Interpolation:
    """``${ expr }`` inside a template; ``raw`` is its source text from ``${`` to ``}``."""

    __slots__ = ("expr", "raw")

    def __init__(self, expr: Expr, raw: str) -> None:
        self.expr = expr
        self.raw = raw


class IfDirective:
    __slots__ = ("cond", "else_parts", "start", "then_parts")

    def __init__(self, start: int, cond: Expr, then_parts: list[Part], else_parts: list[Part]) -> None:
        self.start = start
        self.cond = cond
        self.then_parts = then_parts
        self.else_parts = else_parts


class ForDirective:
    __slots__ = ("body", "coll", "key_var", "start", "val_var")

    def __init__(self, start: int, key_var: str | None, val_var: str, coll: Expr, body: list[Part]) -> None:
        self.start = start
        self.key_var = key_var
        self.val_var = val_var
        self.coll = coll
        self.body = body


Part = str | Interpolation | IfDirective | ForDirective


def _interp_value(part: Interpolation, ctx: Context) -> tuple[Value, bool]:
    before = ctx.hits
    value = part.expr.eval(ctx)
    return value, ctx.hits != before


def _render(parts: Sequence[Part], ctx: Context, out: list[str]) -> None:
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, Interpolation):
            value, unknown = _interp_value(part, ctx)
            if unknown:
                # Nomad's HCL fork: an interpolation that names an unknown variable stays as
                # written, for the Nomad client to interpolate (${NOMAD_PORT_http}, ${attr.x}).
                out.append(part.raw)
                continue
            if value is None:
                raise SyntaxProblem(
                    part.expr.start,
                    "Invalid template interpolation value",
                    "The expression result is null. Cannot include a null value in a string template.",
                )
            try:
                out.append(to_string(value))
            except ConversionError as e:
                raise SyntaxProblem(
                    part.expr.start,
                    "Invalid template interpolation value",
                    f"Cannot include the given value in a string template: {e}.",
                ) from None
        elif isinstance(part, IfDirective):
            cond = part.cond.eval(ctx)
            if cond is None:
                raise SyntaxProblem(
                    part.cond.start, "Invalid template if directive", "The condition is null."
                )
            try:
                truth = to_bool(cond)
            except ConversionError as e:
                raise SyntaxProblem(part.cond.start, "Invalid template if directive", f"{e}.") from None
            _render(part.then_parts if truth else part.else_parts, ctx, out)
        else:
            coll = part.coll.eval(ctx)
            try:
                pairs = iterate(coll)
            except ConversionError as e:
                raise SyntaxProblem(part.coll.start, "Invalid template for directive", str(e)) from None
            for k, v in pairs:
                names: dict[str, Value] = {part.val_var: v}
                if part.key_var is not None:
                    names[part.key_var] = k
                _render(part.body, ctx.child(names), out)


class Template(Expr):
    """A quoted string or heredoc. A template that is exactly one ``${...}`` yields the value itself."""

    __slots__ = ("parts",)

    def __init__(self, start: int, parts: list[Part]) -> None:
        super().__init__(start)
        self.parts = parts

    def eval(self, ctx: Context) -> Value:
        parts = self.parts
        if len(parts) == 1:
            only = parts[0]
            if isinstance(only, str):
                return only
            if isinstance(only, Interpolation):
                value, unknown = _interp_value(only, ctx)
                return only.raw if unknown else value
        out: list[str] = []
        _render(parts, ctx, out)
        return "".join(out)

    def static_text(self) -> str | None:
        if not self.parts:
            return ""
        if len(self.parts) == 1 and isinstance(self.parts[0], str):
            return self.parts[0]
        return None


class Traversal(Expr):
    """``root.attr[index].attr``: ``src`` is its source text (kept when the root is unknown)."""

    __slots__ = ("root", "src", "steps")

    def __init__(self, start: int, root: str, steps: list[Step], src: str) -> None:
        super().__init__(start)
        self.root = root
        self.steps = steps
        self.src = src

    def eval(self, ctx: Context) -> Value:
        value = ctx.variables.get(self.root, _MISSING)
        if value is _MISSING:
            if ctx.unknown_as_text:
                ctx.hits += 1
                return "${" + self.src + "}"
            raise (
                SyntaxProblem(self.start, "Variables not allowed", "Variables may not be used here.")
                if not ctx.variables
                else SyntaxProblem(
                    self.start, "Unknown variable", f'There is no variable named "{self.root}".'
                )
            )
        for step in self.steps:
            value = step.apply(value, ctx)
        return value


class Step:
    __slots__ = ("start",)

    def __init__(self, start: int) -> None:
        self.start = start

    def apply(self, value: Value, ctx: Context) -> Value:
        raise NotImplementedError


class GetAttr(Step):
    __slots__ = ("name",)

    def __init__(self, start: int, name: str) -> None:
        super().__init__(start)
        self.name = name

    def apply(self, value: Value, ctx: Context) -> Value:
        if isinstance(value, dict):
            if self.name in value:
                return value[self.name]
            raise SyntaxProblem(
                self.start,
                "Unsupported attribute",
                f'This object does not have an attribute named "{self.name}".',
            )
        if value is None:
            raise SyntaxProblem(self.start, "Attempt to get attribute from null value", "This value is null.")
        if isinstance(value, list):
            raise SyntaxProblem(
                self.start, "Unsupported attribute", "This value does not have any attributes."
            )
        raise SyntaxProblem(
            self.start,
            "Unsupported attribute",
            f"Can't access attributes on a primitive-typed value ({type_name(value)}).",
        )


class Index(Step):
    __slots__ = ("key",)

    def __init__(self, start: int, key: Expr) -> None:
        super().__init__(start)
        self.key = key

    def apply(self, value: Value, ctx: Context) -> Value:
        key = self.key.eval(ctx)
        if value is None:
            raise SyntaxProblem(self.start, "Attempt to index null value", "This value is null.")
        if isinstance(value, list):
            try:
                n = to_number(key)
            except ConversionError:
                raise SyntaxProblem(
                    self.start,
                    "Invalid index",
                    "The given key does not identify an element in this collection value.",
                ) from None
            if isinstance(n, int) and 0 <= n < len(value):
                return value[n]
            raise SyntaxProblem(
                self.start,
                "Invalid index",
                "The given key does not identify an element in this collection value.",
            )
        if isinstance(value, dict):
            try:
                k = to_string(key)
            except ConversionError:
                raise SyntaxProblem(
                    self.start,
                    "Invalid index",
                    "The given key does not identify an element in this collection value.",
                ) from None
            if k in value:
                return value[k]
            raise SyntaxProblem(
                self.start,
                "Invalid index",
                "The given key does not identify an element in this collection value.",
            )
        raise SyntaxProblem(
            self.start, "Invalid index", f"This value does not have any indices ({type_name(value)})."
        )


class Postfix(Expr):
    """Attribute and index steps after any expression: ``f(x)[0]``, ``(a).b``."""

    __slots__ = ("source", "steps")

    def __init__(self, start: int, source: Expr, steps: list[Step]) -> None:
        super().__init__(start)
        self.source = source
        self.steps = steps

    def eval(self, ctx: Context) -> Value:
        value = self.source.eval(ctx)
        for step in self.steps:
            value = step.apply(value, ctx)
        return value


class Splat(Expr):
    """``list[*].attr`` (and the legacy ``list.*.attr``)."""

    __slots__ = ("source", "steps")

    def __init__(self, start: int, source: Expr, steps: list[Step]) -> None:
        super().__init__(start)
        self.source = source
        self.steps = steps

    def eval(self, ctx: Context) -> Value:
        source = self.source.eval(ctx)
        if source is None:
            return []
        items = source if isinstance(source, list) else [source]
        out: list[Value] = []
        for item in items:
            v = item
            for step in self.steps:
                v = step.apply(v, ctx)
            out.append(v)
        return out


class TupleCons(Expr):
    __slots__ = ("items",)

    def __init__(self, start: int, items: list[Expr]) -> None:
        super().__init__(start)
        self.items = items

    def eval(self, ctx: Context) -> Value:
        return [item.eval(ctx) for item in self.items]


class ObjectCons(Expr):
    """``{ key = value, ... }``; a bare identifier key is the key's name, not a variable."""

    __slots__ = ("items",)

    def __init__(self, start: int, items: list[tuple[Expr, Expr]]) -> None:
        super().__init__(start)
        self.items = items

    def eval(self, ctx: Context) -> Value:
        out: dict[str, Value] = {}
        for key_expr, val_expr in self.items:
            key = key_expr.eval(ctx)
            if key is None:
                raise SyntaxProblem(key_expr.start, "Null value as key", "Can't use a null value as a key.")
            try:
                k = to_string(key)
            except ConversionError as e:
                raise SyntaxProblem(
                    key_expr.start, "Incorrect key type", f"Can't use this value as a key: {e}."
                ) from None
            out[k] = val_expr.eval(ctx)
        return out


class FunctionCall(Expr):
    __slots__ = ("args", "expand_final", "name")

    def __init__(self, start: int, name: str, args: list[Expr], expand_final: bool) -> None:
        super().__init__(start)
        self.name = name
        self.args = args
        self.expand_final = expand_final

    def eval(self, ctx: Context) -> Value:
        fn = ctx.functions.get(self.name)
        if fn is None:
            raise SyntaxProblem(
                self.start, "Call to unknown function", f'There is no function named "{self.name}".'
            )
        args = [a.eval(ctx) for a in self.args]
        if self.expand_final and args:
            last = args.pop()
            if not isinstance(last, list):
                raise SyntaxProblem(
                    self.args[-1].start,
                    "Invalid expanding argument value",
                    "The expanding argument (indicated by ...) must be of a tuple, list, or set type.",
                )
            args.extend(last)
        try:
            return fn(args)
        except ConversionError as e:
            raise SyntaxProblem(
                self.start, "Error in function call", f'Call to function "{self.name}" failed: {e}.'
            ) from None


class Unary(Expr):
    __slots__ = ("op", "operand")

    def __init__(self, start: int, op: str, operand: Expr) -> None:
        super().__init__(start)
        self.op = op
        self.operand = operand

    def eval(self, ctx: Context) -> Value:
        v = self.operand.eval(ctx)
        try:
            if self.op == "!":
                return not to_bool(v)
            return normalize_number(-to_number(v))
        except ConversionError as e:
            raise SyntaxProblem(
                self.operand.start, "Invalid operand", f"Unsuitable value for unary operand: {e}."
            ) from None


def _arith(op: str, a: int | float, b: int | float, start: int) -> Value:
    if op == "+":
        return normalize_number(a + b)
    if op == "-":
        return normalize_number(a - b)
    if op == "*":
        return normalize_number(a * b)
    if b == 0:
        raise SyntaxProblem(start, "Operation failed", "Error during operation: can't divide by zero.")
    if op == "/":
        return normalize_number(
            a / b if not (isinstance(a, int) and isinstance(b, int) and a % b == 0) else a // b
        )
    # cty's modulo keeps the sign of the dividend, like Go's math.Mod
    return normalize_number(
        math.fmod(a, b) if isinstance(a, float) or isinstance(b, float) else int(math.fmod(a, b))
    )


class Binary(Expr):
    __slots__ = ("left", "op", "right")

    def __init__(self, start: int, op: str, left: Expr, right: Expr) -> None:
        super().__init__(start)
        self.op = op
        self.left = left
        self.right = right

    def eval(self, ctx: Context) -> Value:
        op = self.op
        lv = self.left.eval(ctx)
        rv = self.right.eval(ctx)
        if op == "==":
            return equal(lv, rv)
        if op == "!=":
            return not equal(lv, rv)
        if op in ("&&", "||"):
            lb = self._operand(to_bool, lv, "left", self.left.start)
            rb = self._operand(to_bool, rv, "right", self.right.start)
            return (lb and rb) if op == "&&" else (lb or rb)
        ln = self._operand(to_number, lv, "left", self.left.start)
        rn = self._operand(to_number, rv, "right", self.right.start)
        if op == "<":
            return ln < rn
        if op == ">":
            return ln > rn
        if op == "<=":
            return ln <= rn
        if op == ">=":
            return ln >= rn
        return _arith(op, ln, rn, self.start)

    @staticmethod
    def _operand(conv: Callable[[Value], Value], v: Value, side: str, start: int) -> any_number_or_bool:
        if v is None:
            raise SyntaxProblem(
                start,
                "Invalid operand",
                f"Unsuitable value for {side} operand: a {conv.__name__[3:]} is required.",
            )
        try:
            return conv(v)  # type: ignore[return-value]
        except ConversionError as e:
            raise SyntaxProblem(
                start, "Invalid operand", f"Unsuitable value for {side} operand: {e}."
            ) from None


any_number_or_bool = int | float | bool


class Conditional(Expr):
    __slots__ = ("cond", "false_expr", "true_expr")

    def __init__(self, start: int, cond: Expr, true_expr: Expr, false_expr: Expr) -> None:
        super().__init__(start)
        self.cond = cond
        self.true_expr = true_expr
        self.false_expr = false_expr

    def eval(self, ctx: Context) -> Value:
        c = self.cond.eval(ctx)
        if c is None:
            raise SyntaxProblem(
                self.cond.start,
                "Null condition",
                "The condition value is null. Conditions must either be true or false.",
            )
        try:
            truth = to_bool(c)
        except ConversionError as e:
            raise SyntaxProblem(
                self.cond.start,
                "Incorrect condition type",
                f"The condition expression must be of type bool: {e}.",
            ) from None
        return self.true_expr.eval(ctx) if truth else self.false_expr.eval(ctx)


class ForExpr(Expr):
    """``[for k, v in coll : expr if cond]`` and ``{for k, v in coll : key => value...}``."""

    __slots__ = ("coll", "cond", "grouping", "key_expr", "key_var", "val_expr", "val_var")

    def __init__(
        self,
        start: int,
        key_var: str | None,
        val_var: str,
        coll: Expr,
        key_expr: Expr | None,
        val_expr: Expr,
        cond: Expr | None,
        grouping: bool,
    ) -> None:
        super().__init__(start)
        self.key_var = key_var
        self.val_var = val_var
        self.coll = coll
        self.key_expr = key_expr
        self.val_expr = val_expr
        self.cond = cond
        self.grouping = grouping

    def eval(self, ctx: Context) -> Value:
        coll = self.coll.eval(ctx)
        try:
            pairs = iterate(coll)
        except ConversionError as e:
            raise SyntaxProblem(self.coll.start, "Iteration over non-iterable value", str(e)) from None
        items: list[Value] = []
        obj: dict[str, Value] = {}
        for k, v in pairs:
            names: dict[str, Value] = {self.val_var: v}
            if self.key_var is not None:
                names[self.key_var] = k
            inner = ctx.child(names)
            if self.cond is not None:
                c = self.cond.eval(inner)
                try:
                    if not to_bool(c):
                        continue
                except ConversionError as e:
                    raise SyntaxProblem(self.cond.start, "Invalid 'for' condition", f"{e}.") from None
            value = self.val_expr.eval(inner)
            if self.key_expr is None:
                items.append(value)
                continue
            try:
                key = to_string(self.key_expr.eval(inner))
            except ConversionError as e:
                raise SyntaxProblem(self.key_expr.start, "Invalid object key", f"{e}.") from None
            if self.grouping:
                group = obj.setdefault(key, [])
                assert isinstance(group, list)
                group.append(value)
            elif key in obj:
                raise SyntaxProblem(
                    self.key_expr.start,
                    "Duplicate object key",
                    f"Two different items produced the key \"{key}\" in this 'for' expression. "
                    "If duplicates are expected, use the ellipsis (...) after the value expression "
                    "to enable grouping by key.",
                )
            else:
                obj[key] = value
        return items if self.key_expr is None else obj


class Parenthesized(Expr):
    __slots__ = ("inner",)

    def __init__(self, start: int, inner: Expr) -> None:
        super().__init__(start)
        self.inner = inner

    def eval(self, ctx: Context) -> Value:
        return self.inner.eval(ctx)
