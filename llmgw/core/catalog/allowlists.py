"""What the operator lets a catalog name on this cluster, beyond the catalog's own rules.

Two allowlists are runtime settings, not part of the catalog: the repositories a
profile's ``image`` may come from (``LLMGW_ALLOWED_IMAGES``, ``images.py``; its tag
must also name a release of the profile's engine llmgw can rely on, or its digest
be one the operator trusts, ``LLMGW_TRUSTED_IMAGE_DIGESTS``) and the
non-global networks a file URL ``source`` may point into
(``LLMGW_SOURCE_ALLOWED_NETWORKS``, ``sources.py``). ``ClusterAllowlists`` carries
both; ``allowlist_refusals`` is the one rule over a profile, asked in two places
with the same words:

- at the catalog's doors, ``load_catalog(..., allowlists=)`` (``llmgw catalog
  check``, the admin API's diff and apply, ``llmgw serve --catalog``), where each
  refusal is an error diagnostic at the profile's key, so CI's apply fails;
- by the renderer, for every replica, whatever wrote the applied catalog.

Loads without allowlists (the reconciler's and the routers' of the applied catalog)
leave them to the renderer, so tightening a setting makes the affected models
unplaceable (said in the status) rather than the whole applied catalog unreadable.

The same value carries what the cluster's engines are (``engines``: the release each
default image pins and every vendored release's parser registry), so a profile's
``tool_call_parser`` and ``reasoning_parser`` are checked at the same doors against the
release its image runs (``llmgw.core.catalog.tool_calling.parser_refusals``).

It also carries the largest nodes per GPU model (``node_gpus``, ``LLMGW_NODE_GPUS``), so
the same doors refuse a shape no node can hold (``node_shapes``).

Must not: read the environment (``llmgw.render.settings`` does).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from llmgw.core.catalog.images import Release, image_refusal, image_release, release_refusal
from llmgw.core.catalog.model import Engine, Profile, Role
from llmgw.core.catalog.node_shapes import NodeGpus
from llmgw.core.catalog.sources import (
    FileUrlSource,
    IpNetwork,
    SourceError,
    parse_source,
    source_address_refusal,
)
from llmgw.core.catalog.tool_calling import ParserRegistry, parser_refusals


@dataclass(frozen=True, slots=True)
class ClusterAllowlists:
    # Repositories, or prefixes ending in "/", in normal form (images.parse_allowed_images).
    images: tuple[str, ...]
    # Networks a file URL may name although they are not global (sources.parse_allowed_networks).
    source_networks: tuple[IpNetwork, ...] = ()
    # Image digests the operator vouches for, whatever release their tag names (images.release_refusal).
    trusted_image_digests: tuple[str, ...] = ()
    # The engines this cluster runs: their parser registries, and the default images.
    engines: ClusterEngines | None = None
    # The most GPUs one node has, per GPU model (LLMGW_NODE_GPUS; node_shapes.shape_refusal).
    node_gpus: tuple[NodeGpus, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterEngines:
    default_images: Mapping[Engine, str]
    parsers: ParserRegistry

    def release(self, profile: Profile) -> Release | None:
        """The engine release the profile's image (or the default one) names, if any."""
        image = profile.image or self.default_images.get(profile.engine)
        return None if image is None else image_release(profile.engine, image)


def allowlist_refusals(
    profile: Profile, allowlists: ClusterAllowlists, roles: Sequence[Role] = (Role.CHAT,)
) -> Iterator[tuple[str, str]]:
    """``(key, why)`` for each key of ``profile`` naming what this cluster does not allow
    (or, its parsers, what the engine release it runs does not have)."""
    if allowlists.engines is not None:
        engines = allowlists.engines
        yield from parser_refusals(profile, roles, engines.release(profile), engines.parsers)
    if profile.image is not None:
        refusal = image_refusal(profile.image, allowlists.images) or release_refusal(
            profile.image, profile.engine, allowlists.trusted_image_digests
        )
        if refusal is not None:
            yield "image", refusal
    if profile.source is not None:
        try:
            source = parse_source(profile.source)
        except SourceError:
            return  # the catalog's own rules report it
        if isinstance(source, FileUrlSource):
            refusal = source_address_refusal(source, allowlists.source_networks)
            if refusal is not None:
                yield "source", refusal
