"""Settings from flags and environment variables, with one rule: a flag wins over its
variable, which wins over the default.

The router, the admin API and the simulated engine each keep a table of their
settings' flags; this module reads such a table into an argparse parser and back
into values. Flags that were not given stay absent from the namespace
(``argparse.SUPPRESS``), so the variable and then the default can apply.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Flag:
    field: str  # the settings field it fills
    flag: str  # "--port"
    env: str  # "LLMGW_ROUTER_PORT"
    parse: Callable[[str], Any]
    help: str
    is_switch: bool = False
    # The namespace attribute; differs from ``field`` when several tables share a parser.
    dest: str = ""

    @property
    def namespace_dest(self) -> str:
        return self.dest or self.field


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off", ""):
        return False
    raise ValueError(f"expected a boolean (true/false/1/0), got {raw!r}")


def parse_host_names(raw: str) -> tuple[str, ...]:
    """A comma-separated list of host names, lowercase (an allowed-hosts flag)."""
    return tuple(part.strip().lower() for part in raw.split(",") if part.strip())


def _shown(default: Any) -> str:
    if default is None or default == "" or default == ():
        return "none"
    if isinstance(default, enum.Enum):
        return str(default.value)
    return str(default)


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag], defaults: Mapping[str, Any]) -> None:
    """Each flag, its help saying its default and its variable."""
    for spec in flags:
        help_text = f"{spec.help} (default {_shown(defaults.get(spec.field))}; env {spec.env})"
        if spec.is_switch:
            parser.add_argument(spec.flag, dest=spec.namespace_dest, action="store_const", const=True,
                                default=argparse.SUPPRESS, help=help_text)  # fmt: skip
        else:
            parser.add_argument(spec.flag, dest=spec.namespace_dest, type=spec.parse,
                                default=argparse.SUPPRESS, help=help_text)  # fmt: skip


def read_flags(
    flags: Iterable[Flag], environ: Mapping[str, str], namespace: argparse.Namespace | None = None
) -> tuple[dict[str, Any], list[str]]:
    """``(values by field, problems)``: given flags, else non-empty variables; the rest left out."""
    given = vars(namespace) if namespace is not None else {}
    values: dict[str, Any] = {}
    problems: list[str] = []
    for spec in flags:
        if spec.namespace_dest in given:
            values[spec.field] = given[spec.namespace_dest]
        elif environ.get(spec.env, "") != "":
            try:
                values[spec.field] = spec.parse(environ[spec.env])
            except ValueError as exc:
                problems.append(f"{spec.env}={environ[spec.env]!r}: {exc}")
    return values, problems
