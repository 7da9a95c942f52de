"""The catalog's ``mirror:NAME@VERSION`` sources checked against a mirror's index, as diagnostics.

A mirrored version exists for the catalog only once the mirror says it is complete
(``llmgw.core.mirror.check_reference``: every file present and verified, nothing
downloading). This module finds every profile's ``source`` that names the mirror and
turns each problem into a ``Diagnostic`` at that ``source``'s line and column, so
``llmgw catalog check --mirror`` reports it like any other catalog error.

It reads the YAML itself (the same safe reader and source map the loader uses), so a
catalog with shape errors elsewhere still gets its mirror sources checked in the same
run. Sources that are not mirror sources, or not text, are the loader's business and
are skipped here. Must not: fetch the index (``llmgw.mirror.load_index`` does, in the
CLI) or decide completeness (the core mirror rule does).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.core.catalog.sources import MirrorSource, SourceError, parse_source
from llmgw.core.catalog.yaml_source import DEFAULT_LIMITS, ReadLimits, SourceMap, read_yaml
from llmgw.core.diagnostics import Diagnostic, Severity, YamlPath, sort_diagnostics
from llmgw.core.mirror import MirrorIndex, MirrorRefError, check_reference, parse_ref


@dataclass(frozen=True)
class MirrorSources:
    """The mirror sources of one catalog text, and where each is written."""

    filename: str
    found: tuple[tuple[YamlPath, MirrorSource], ...]  # the ``source`` path of each, in file order
    source_map: SourceMap


def find_mirror_sources(text: str, *, filename: str, limits: ReadLimits = DEFAULT_LIMITS) -> MirrorSources:
    """Every ``models.NAME.profiles[i].source`` that is a well-formed mirror source."""
    read = read_yaml(text, filename=filename, limits=limits)
    found: list[tuple[YamlPath, MirrorSource]] = []
    models = read.data.get("models") if isinstance(read.data, dict) else None
    for name, model in models.items() if isinstance(models, dict) else ():
        profiles = model.get("profiles") if isinstance(model, dict) else None
        for index, profile in enumerate(profiles if isinstance(profiles, list) else ()):
            source = profile.get("source") if isinstance(profile, dict) else None
            if not isinstance(source, str):
                continue
            try:
                parsed = parse_source(source)
            except SourceError:
                continue  # the loader reports a malformed source
            if isinstance(parsed, MirrorSource):
                found.append((("models", name, "profiles", index, "source"), parsed))
    return MirrorSources(filename, tuple(found), read.source_map)


def mirror_diagnostics(sources: MirrorSources, index: MirrorIndex) -> tuple[Diagnostic, ...]:
    """An error at each mirror source the mirror cannot serve yet: unknown, downloading or incomplete."""
    diagnostics: list[Diagnostic] = []
    for path, source in sources.found:
        try:
            problem = check_reference(parse_ref(str(source)), index)
        except MirrorRefError as exc:
            problem = str(exc)
        if problem is not None:
            position = sources.source_map.value_position(path)
            diagnostics.append(Diagnostic(Severity.ERROR, path, problem, sources.filename, position))
    return tuple(sort_diagnostics(diagnostics))


def check_mirror_sources(
    text: str, index: MirrorIndex, *, filename: str, limits: ReadLimits = DEFAULT_LIMITS
) -> tuple[Diagnostic, ...]:
    """``find_mirror_sources`` then ``mirror_diagnostics``."""
    return mirror_diagnostics(find_mirror_sources(text, filename=filename, limits=limits), index)
