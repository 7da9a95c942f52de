"""Writing values into HCL so that they arrive verbatim and can change nothing else.

Every string that came from a catalog is written as a quoted HCL string with
quotes, backslashes and control characters escaped, and HCL's template
sequences ``${`` and ``%{`` doubled (``$${``, ``%%{``), so a model name or an
argument is data and never syntax: it cannot close the string, open a block,
or reach Nomad's interpolation. Only ``Runtime`` values, which llmgw's own code
makes, are written with their ``${...}`` intact.

These are the only functions templates use to write values (as jinja2 filters).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from llmgw.core.engines import Runtime

_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _escape_text(text: str) -> str:
    out: list[str] = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F or 0x80 <= ord(char) < 0xA0 or char in "\u2028\u2029":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    # HCL reads ${ and %{ inside a quoted string as template sequences; $${ and
    # %%{ are their literal forms. Doubling after escaping cannot create new ones.
    return "".join(out).replace("${", "$${").replace("%{", "%%{")


def hcl_string(value: object) -> str:
    """A quoted HCL string: catalog text escaped, llmgw's Runtime text kept."""
    if isinstance(value, Runtime):
        if '"' in value.text or "\\" in value.text or "\n" in value.text:
            raise ValueError(f"runtime interpolation {value.text!r} would need escaping")
        return f'"{value.text}"'
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f"hcl_string takes text, not {type(value).__name__}")
    return f'"{_escape_text(str(value))}"'


def hcl_list(values: Iterable[object]) -> str:
    return "[" + ", ".join(hcl_string(v) for v in values) + "]"


def hcl_number(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"hcl_number takes an integer, not {value!r}")
    return str(value)


def hcl_bool(value: object) -> str:
    if not isinstance(value, bool):
        raise TypeError(f"hcl_bool takes a boolean, not {value!r}")
    return "true" if value else "false"


def hcl_object(values: Mapping[str, object], indent: int = 0) -> str:
    """An HCL object (``meta = {...}``, ``env = {...}``) with quoted keys, sorted.

    Keys are quoted and escaped too: an env name or meta key from a catalog is
    text like any other. (A block body's attribute names must be identifiers,
    so maps are written as attributes holding an object, which jobspec2 accepts
    for meta and env alike.)
    """
    if not values:
        return "{}"
    pad = " " * indent
    lines = [f"{pad}  {hcl_string(k)} = {hcl_string(v)}" for k, v in sorted(values.items())]
    return "{\n" + "\n".join(lines) + f"\n{pad}}}"


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def hcl_attributes(values: Mapping[str, object], indent: int) -> str:
    """``key = "value"`` lines for a block whose keys must be identifiers (a service's meta).

    Only llmgw's own keys (from llmgw.core.conventions) are written this way;
    a key that is not an identifier is refused rather than quoted into syntax.
    """
    pad = " " * indent
    for key in values:
        if not _IDENTIFIER.match(key):
            raise ValueError(f"{key!r} cannot be an HCL attribute name")
    return "\n".join(f"{pad}{key} = {hcl_string(value)}" for key, value in sorted(values.items()))
