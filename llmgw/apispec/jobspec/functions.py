"""The HCL functions llmgw calls, of those jobspec2 registers (``jobspec2/functions.go``).

Owns the function table handed to expression evaluation. It holds only what
something in llmgw calls: ``format``, ``join``, ``lookup`` and ``upper`` (the
rendered jobspecs call none; the parser's tests and fixtures call these), after
cty's stdlib. Every other name, including the many real Nomad has, is absent, so
a call answers as HCL answers a function its table lacks: "Call to unknown
function" (see DESIGN.md). The filesystem functions are the exception: real
``/v1/jobs/parse`` knows them and refuses them, so they answer its refusal.

Must not: read files, the clock, randomness or the environment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from llmgw.apispec.jobspec.expressions import (
    ConversionError,
    Value,
    to_bool,
    to_number,
    to_string,
    type_name,
)

Function = Callable[[list[Value]], Value]


def _arity(args: list[Value], n: int, name: str) -> None:
    if len(args) != n:
        raise ConversionError(f"{name} takes {n} argument{'s' if n != 1 else ''}, got {len(args)}")


def _str1(fn: Callable[[str], Value], name: str) -> Function:
    def call(args: list[Value]) -> Value:
        _arity(args, 1, name)
        return fn(to_string(args[0]))

    return call


def _list(v: Value) -> list[Value]:
    if isinstance(v, list):
        return v
    raise ConversionError(f"list of any single type required, got {type_name(v)}")


def _obj(v: Value) -> dict[str, Value]:
    if isinstance(v, dict):
        return v
    raise ConversionError(f"map or object required, got {type_name(v)}")


def _format(args: list[Value]) -> Value:
    if not args:
        raise ConversionError("format needs a format string")
    fmt = to_string(args[0])
    rest = args[1:]
    out: list[str] = []
    i = 0
    argi = 0
    verb = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")
    while i < len(fmt):
        if fmt[i] != "%":
            j = fmt.find("%", i)
            j = len(fmt) if j < 0 else j
            out.append(fmt[i:j])
            i = j
            continue
        m = verb.match(fmt, i)
        if m is None:
            raise ConversionError("invalid format verb")
        flags, width, prec, v = m.groups()
        i = m.end()
        if v == "%":
            out.append("%")
            continue
        if argi >= len(rest):
            raise ConversionError(f"not enough arguments for %{v} at offset {m.start()}")
        arg = rest[argi]
        argi += 1
        if v == "v":
            s = json.dumps(arg) if isinstance(arg, list | dict) else to_string(arg)
        elif v == "q":
            s = json.dumps(to_string(arg))
        elif v == "s":
            s = to_string(arg)
        elif v == "d":
            s = str(int(to_number(arg)))
        elif v in "feEgG":
            p = int(prec) if prec else 6
            s = format(float(to_number(arg)), f".{p}{v}")
        elif v == "t":
            s = "true" if to_bool(arg) else "false"
        elif v in "xX":
            n = to_number(arg)
            s = format(int(n), v) if isinstance(n, int) else to_string(arg).encode().hex()
        elif v in "bo":
            s = format(int(to_number(arg)), v)
        else:
            raise ConversionError(f"unsupported format verb %{v}")
        if width:
            w = int(width)
            s = s.ljust(w) if "-" in flags else s.rjust(w, "0" if "0" in flags else " ")
        out.append(s)
    if argi < len(rest):
        raise ConversionError("too many arguments; no verbs for the remaining arguments")
    return "".join(out)


def _join(args: list[Value]) -> Value:
    if len(args) < 2:
        raise ConversionError("join needs a separator and at least one list")
    sep = to_string(args[0])
    items: list[str] = []
    for lst in args[1:]:
        for item in _list(lst):
            if item is None:
                raise ConversionError("element is null")
            items.append(to_string(item))
    return sep.join(items)


def _lookup(args: list[Value]) -> Value:
    if len(args) not in (2, 3):
        raise ConversionError("lookup takes 2 or 3 arguments")
    m, key = _obj(args[0]), to_string(args[1])
    if key in m:
        return m[key]
    if len(args) == 3:
        return args[2]
    raise ConversionError(f'lookup failed to find key "{key}"')


def _filesystem(name: str) -> Function:
    def call(args: list[Value]) -> Value:
        # /v1/jobs/parse runs jobspec2 with AllowFS: false
        raise ConversionError("filesystem function disabled")

    return call


_IMPLEMENTED: dict[str, Function] = {
    "format": _format,
    "join": _join,
    "lookup": _lookup,
    "upper": _str1(str.upper, "upper"),
}

# jobspec2 registers these and /v1/jobs/parse runs it with AllowFS: false.
_FILESYSTEM = ["abspath", "basename", "dirname", "file", "filebase64", "fileexists", "fileset", "pathexpand"]


def _table() -> Mapping[str, Function]:
    table: dict[str, Function] = dict(_IMPLEMENTED)
    for name in _FILESYSTEM:
        table[name] = _filesystem(name)
    return MappingProxyType(table)


FUNCTIONS: Mapping[str, Function] = _table()
