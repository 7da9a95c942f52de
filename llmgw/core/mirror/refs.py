"""Mirror references: ``mirror:NAME@VERSION`` in a catalog, ``NAME@VERSION`` on the command line.

Owns the value types naming a mirrored version and the rules for what a name or a
version may look like. Both become directory names in the mirror's store and on
nodes, so they are restricted to a safe alphabet here, once. Must not touch the
store or the network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NewType

MirrorName = NewType("MirrorName", str)
MirrorVersion = NewType("MirrorVersion", str)

SOURCE_PREFIX = "mirror:"

# A name or version is one path segment: no "/", no leading dot (so never "." or
# ".."), short enough for any file system. The lengths match the catalog's
# mirror:NAME@VERSION rule in llmgw.core.catalog.sources.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class MirrorRefError(ValueError):
    """A reference that cannot name a mirrored version; the message says what to write."""


@dataclass(frozen=True, order=True)
class MirrorRef:
    name: MirrorName
    version: MirrorVersion

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def source(self) -> str:
        """The form a catalog's ``source:`` uses."""
        return f"{SOURCE_PREFIX}{self.name}@{self.version}"


def is_valid_segment(text: str) -> bool:
    return _SEGMENT.fullmatch(text) is not None


def check_name(text: str) -> MirrorName:
    if not is_valid_segment(text):
        raise MirrorRefError(
            f"invalid mirror name {text!r}: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (at most 128 characters)"
        )
    return MirrorName(text)


def check_version(text: str) -> MirrorVersion:
    if _VERSION.fullmatch(text) is None:
        raise MirrorRefError(
            f"invalid mirror version {text!r}: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (at most 64 characters)"
        )
    return MirrorVersion(text)


def parse_ref(text: str) -> MirrorRef:
    """``NAME@VERSION`` or ``mirror:NAME@VERSION`` -> MirrorRef."""
    body = text.removeprefix(SOURCE_PREFIX)
    name, sep, version = body.partition("@")
    if not sep or not name or not version:
        raise MirrorRefError(f"invalid mirror reference {text!r}: write NAME@VERSION, e.g. llama-8b@2024-07")
    return MirrorRef(check_name(name), check_version(version))


def is_mirror_source(source: str) -> bool:
    """True when a catalog ``source:`` points at the mirror (and so must pass ``check_reference``)."""
    return source.startswith(SOURCE_PREFIX)
