"""The HCL functions jobspec2 offers (``jobspec2/functions.go``), as far as the stand-in implements them.

Owns the function table handed to expression evaluation. Every name jobspec2
registers is known here: the common string, collection, number and encoding
functions are implemented after cty's stdlib; the rest (crypto, cidr, dates,
uuids, yaml, and the filesystem functions that the server disables anyway) fail
with a diagnostic that says the stand-in lacks them, so a template that needs
one is noticed instead of being parsed wrongly.

Must not: read files, the clock, randomness or the environment.
"""

from __future__ import annotations

import base64
import json
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping
from types import MappingProxyType

from llmgw.apispec.jobspec.expressions import (
    ConversionError,
    Value,
    equal,
    normalize_number,
    number_text,
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


def _split(args: list[Value]) -> Value:
    _arity(args, 2, "split")
    sep, s = to_string(args[0]), to_string(args[1])
    return s.split(sep) if sep else list(s)


def _replace(args: list[Value]) -> Value:
    _arity(args, 3, "replace")
    s, old, new = (to_string(a) for a in args)
    if len(old) > 1 and old.startswith("/") and old.endswith("/"):
        return re.sub(old[1:-1], _go_repl(new), s)
    return s.replace(old, new)


def _go_repl(new: str) -> str:
    # Go's $1 / ${1} group references to Python's \g<1>
    return re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", new.replace("\\", "\\\\"))


def _regex_replace(args: list[Value]) -> Value:
    _arity(args, 3, "regex_replace")
    s, pattern, new = (to_string(a) for a in args)
    return re.sub(pattern, _go_repl(new), s)


def _substr(args: list[Value]) -> Value:
    _arity(args, 3, "substr")
    s = to_string(args[0])
    off, length = int(to_number(args[1])), int(to_number(args[2]))
    if off < 0:
        off = max(len(s) + off, 0)
    if off > len(s):
        raise ConversionError("offset must be less than the length of the string")
    return s[off:] if length < 0 else s[off : off + length]


def _trim(args: list[Value]) -> Value:
    _arity(args, 2, "trim")
    return to_string(args[0]).strip(to_string(args[1]))


def _trimprefix(args: list[Value]) -> Value:
    _arity(args, 2, "trimprefix")
    return to_string(args[0]).removeprefix(to_string(args[1]))


def _trimsuffix(args: list[Value]) -> Value:
    _arity(args, 2, "trimsuffix")
    return to_string(args[0]).removesuffix(to_string(args[1]))


def _indent(args: list[Value]) -> Value:
    _arity(args, 2, "indent")
    pad = " " * int(to_number(args[0]))
    return to_string(args[1]).replace("\n", "\n" + pad)


def _title(s: str) -> str:
    return re.sub(r"(^|\s)(\S)", lambda m: m.group(1) + m.group(2).upper(), s)


def _length(args: list[Value]) -> Value:
    _arity(args, 1, "length")
    v = args[0]
    if isinstance(v, list | dict):
        return len(v)
    if isinstance(v, str):
        return len(v)
    raise ConversionError(
        f"argument must be a string, a collection type, or a structural type, not {type_name(v)}"
    )


def _lookup(args: list[Value]) -> Value:
    if len(args) not in (2, 3):
        raise ConversionError("lookup takes 2 or 3 arguments")
    m, key = _obj(args[0]), to_string(args[1])
    if key in m:
        return m[key]
    if len(args) == 3:
        return args[2]
    raise ConversionError(f'lookup failed to find key "{key}"')


def _merge(args: list[Value]) -> Value:
    out: dict[str, Value] = {}
    for a in args:
        if a is not None:
            out.update(_obj(a))
    return out


def _keys(args: list[Value]) -> Value:
    _arity(args, 1, "keys")
    return sorted(_obj(args[0]))


def _values(args: list[Value]) -> Value:
    _arity(args, 1, "values")
    m = _obj(args[0])
    return [m[k] for k in sorted(m)]


def _concat(args: list[Value]) -> Value:
    out: list[Value] = []
    for a in args:
        out.extend(_list(a))
    return out


def _contains(args: list[Value]) -> Value:
    _arity(args, 2, "contains")
    return any(equal(x, args[1]) for x in _list(args[0]))


def _coalesce(args: list[Value]) -> Value:
    for a in args:
        if a is not None and a != "":
            return a
    raise ConversionError("no non-null, non-empty-string arguments")


def _coalescelist(args: list[Value]) -> Value:
    for a in args:
        if _list(a):
            return a
    raise ConversionError("no non-empty list arguments")


def _compact(args: list[Value]) -> Value:
    _arity(args, 1, "compact")
    return [to_string(x) for x in _list(args[0]) if x is not None and x != ""]


def _distinct(args: list[Value]) -> Value:
    _arity(args, 1, "distinct")
    out: list[Value] = []
    for x in _list(args[0]):
        if not any(equal(x, y) for y in out):
            out.append(x)
    return out


def _element(args: list[Value]) -> Value:
    _arity(args, 2, "element")
    lst = _list(args[0])
    if not lst:
        raise ConversionError("cannot use element function with an empty list")
    i = int(to_number(args[1]))
    if i < 0:
        raise ConversionError("cannot use element function with a negative index")
    return lst[i % len(lst)]


def _flatten(args: list[Value]) -> Value:
    _arity(args, 1, "flatten")
    out: list[Value] = []

    def walk(v: Value) -> None:
        for x in _list(v):
            if isinstance(x, list):
                walk(x)
            else:
                out.append(x)

    walk(args[0])
    return out


def _index(args: list[Value]) -> Value:
    _arity(args, 2, "index")
    for i, x in enumerate(_list(args[0])):
        if equal(x, args[1]):
            return i
    raise ConversionError("item not found")


def _range(args: list[Value]) -> Value:
    nums = [to_number(a) for a in args]
    start: int | float
    end: int | float
    step: int | float
    if len(nums) == 1:
        start, end, step = 0, nums[0], 1 if nums[0] >= 0 else -1
    elif len(nums) == 2:
        start, end = nums
        step = 1 if end >= start else -1
    elif len(nums) == 3:
        start, end, step = nums
    else:
        raise ConversionError("range takes 1 to 3 arguments")
    if step == 0:
        raise ConversionError("step must not be zero")
    out: list[Value] = []
    v = start
    while (step > 0 and v < end) or (step < 0 and v > end):
        out.append(normalize_number(v))
        v += step
        if len(out) > 1024:
            raise ConversionError("more than 1024 values were generated")
    return out


def _reverse(args: list[Value]) -> Value:
    _arity(args, 1, "reverse")
    v = args[0]
    if isinstance(v, str):
        return v[::-1]
    return list(reversed(_list(v)))


def _slice(args: list[Value]) -> Value:
    _arity(args, 3, "slice")
    lst = _list(args[0])
    a, b = int(to_number(args[1])), int(to_number(args[2]))
    if a < 0 or b > len(lst) or a > b:
        raise ConversionError("invalid slice indices")
    return lst[a:b]


def _sort(args: list[Value]) -> Value:
    _arity(args, 1, "sort")
    return sorted(to_string(x) for x in _list(args[0]))


def _zipmap(args: list[Value]) -> Value:
    _arity(args, 2, "zipmap")
    ks, vs = _list(args[0]), _list(args[1])
    if len(ks) != len(vs):
        raise ConversionError("number of keys and values must match")
    return {to_string(k): v for k, v in zip(ks, vs, strict=True)}


def _num1(fn: Callable[[float], float], name: str) -> Function:
    def call(args: list[Value]) -> Value:
        _arity(args, 1, name)
        return normalize_number(fn(to_number(args[0])))

    return call


def _minmax(pick: Callable[[list[int | float]], int | float], name: str) -> Function:
    def call(args: list[Value]) -> Value:
        if not args:
            raise ConversionError(f"{name} needs at least one argument")
        return pick([to_number(a) for a in args])

    return call


def _pow(args: list[Value]) -> Value:
    _arity(args, 2, "pow")
    return normalize_number(float(to_number(args[0])) ** float(to_number(args[1])))


def _log(args: list[Value]) -> Value:
    _arity(args, 2, "log")
    return normalize_number(math.log(to_number(args[0]), to_number(args[1])))


def _parseint(args: list[Value]) -> Value:
    _arity(args, 2, "parseint")
    try:
        return int(to_string(args[0]), int(to_number(args[1])))
    except ValueError:
        raise ConversionError(f"cannot parse {to_string(args[0])!r} as a base {args[1]} integer") from None


def _signum(args: list[Value]) -> Value:
    _arity(args, 1, "signum")
    n = to_number(args[0])
    return (n > 0) - (n < 0)


def _jsonencode(args: list[Value]) -> Value:
    _arity(args, 1, "jsonencode")
    return json.dumps(args[0], separators=(",", ":"), ensure_ascii=False)


def _jsondecode(args: list[Value]) -> Value:
    _arity(args, 1, "jsondecode")
    try:
        v: Value = json.loads(to_string(args[0]))
    except json.JSONDecodeError as e:
        raise ConversionError(str(e)) from None
    return _normalize_json(v)


def _normalize_json(v: Value) -> Value:
    if isinstance(v, float):
        return normalize_number(v)
    if isinstance(v, list):
        return [_normalize_json(x) for x in v]
    if isinstance(v, dict):
        return {k: _normalize_json(x) for k, x in v.items()}
    return v


def _base64decode(args: list[Value]) -> Value:
    _arity(args, 1, "base64decode")
    try:
        return base64.b64decode(to_string(args[0]), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise ConversionError("failed to decode base64 data") from None


def _tostring(args: list[Value]) -> Value:
    _arity(args, 1, "tostring")
    return None if args[0] is None else to_string(args[0])


def _tonumber(args: list[Value]) -> Value:
    _arity(args, 1, "tonumber")
    return None if args[0] is None else to_number(args[0])


def _tobool(args: list[Value]) -> Value:
    _arity(args, 1, "tobool")
    return None if args[0] is None else to_bool(args[0])


def _missing(name: str) -> Function:
    def call(args: list[Value]) -> Value:
        raise ConversionError(f"the dev stand-in does not implement {name}(); real Nomad does")

    return call


def _filesystem(name: str) -> Function:
    def call(args: list[Value]) -> Value:
        # /v1/jobs/parse runs jobspec2 with AllowFS: false
        raise ConversionError("filesystem function disabled")

    return call


_IMPLEMENTED: dict[str, Function] = {
    "abs": _num1(abs, "abs"),
    "base64decode": _base64decode,
    "base64encode": _str1(lambda s: base64.b64encode(s.encode()).decode(), "base64encode"),
    "ceil": _num1(math.ceil, "ceil"),
    "chomp": _str1(lambda s: re.sub(r"(\r\n|\n|\r)+$", "", s), "chomp"),
    "coalesce": _coalesce,
    "coalescelist": _coalescelist,
    "compact": _compact,
    "concat": _concat,
    "contains": _contains,
    "distinct": _distinct,
    "element": _element,
    "flatten": _flatten,
    "floor": _num1(math.floor, "floor"),
    "format": _format,
    "indent": _indent,
    "index": _index,
    "join": _join,
    "jsondecode": _jsondecode,
    "jsonencode": _jsonencode,
    "keys": _keys,
    "length": _length,
    "log": _log,
    "lookup": _lookup,
    "lower": _str1(str.lower, "lower"),
    "max": _minmax(max, "max"),
    "merge": _merge,
    "min": _minmax(min, "min"),
    "parseint": _parseint,
    "pow": _pow,
    "range": _range,
    "regex_replace": _regex_replace,
    "replace": _replace,
    "reverse": _reverse,
    "signum": _signum,
    "slice": _slice,
    "sort": _sort,
    "split": _split,
    "strlen": _str1(len, "strlen"),
    "strrev": _str1(lambda s: s[::-1], "strrev"),
    "substr": _substr,
    "title": _str1(_title, "title"),
    "trim": _trim,
    "trimprefix": _trimprefix,
    "trimspace": _str1(str.strip, "trimspace"),
    "trimsuffix": _trimsuffix,
    "upper": _str1(str.upper, "upper"),
    "urlencode": _str1(lambda s: urllib.parse.quote_plus(s), "urlencode"),
    "values": _values,
    "zipmap": _zipmap,
}

_NOT_IMPLEMENTED = [
    "bcrypt",
    "can",
    "chunklist",
    "cidrhost",
    "cidrnetmask",
    "cidrsubnet",
    "cidrsubnets",
    "convert",
    "csvdecode",
    "formatdate",
    "formatlist",
    "md5",
    "rsadecrypt",
    "setintersection",
    "setproduct",
    "setunion",
    "sha1",
    "sha256",
    "sha512",
    "timeadd",
    "try",
    "uuidv4",
    "uuidv5",
    "yamldecode",
    "yamlencode",
]

_FILESYSTEM = ["abspath", "basename", "dirname", "file", "filebase64", "fileexists", "fileset", "pathexpand"]


def _table() -> Mapping[str, Function]:
    table: dict[str, Function] = dict(_IMPLEMENTED)
    for name in _NOT_IMPLEMENTED:
        table[name] = _missing(name)
    for name in _FILESYSTEM:
        table[name] = _filesystem(name)
    return MappingProxyType(table)


FUNCTIONS: Mapping[str, Function] = _table()

# number_text is re-exported for callers formatting numbers the way templates do
__all__ = ["FUNCTIONS", "Function", "number_text"]
