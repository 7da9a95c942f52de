"""Which container images a catalog may name: the operator's allowlist of repositories.

A profile's ``image`` replaces the program that runs as root on a GPU node, with
the host's network and IPC namespaces, the node's GPUs and every mirrored model
mounted: whoever picks the image picks the code, and the engine security policy
(which flags and env a catalog may pass) means nothing for an image llmgw has
never seen. So a catalog may name only images from repositories the operator
allows (``RenderSettings.allowed_images``, ``LLMGW_ALLOWED_IMAGES``); by default
the repositories of the engines' default images, any tag or digest.

One rule, asked in two places with the same words: the renderer refuses to render
such a profile (the last door, whatever wrote the catalog), and the catalog's doors
(``llmgw catalog check``, the admin API's diff and apply) report it as a diagnostic
at the profile's ``image`` (``load_catalog(..., allowlists=)``), so CI's apply fails
instead of leaving the model silently unplaceable.

Owns: reading a Docker image reference strictly (the distribution/reference
grammar, ASCII only, no surrounding space), its normal form (``vllm/x`` is
``docker.io/vllm/x``, ``ubuntu`` is ``docker.io/library/ubuntu``), reading
allowlist entries, and the answer for one image. An entry is a repository
(``vllm/vllm-openai``: that repository, any tag or digest) or a prefix ending in
``/`` (``registry.example.com:5000/llm/``: every repository under it). Matching is
by whole path segments, so ``vllm/vllm-openai`` does not allow
``vllm/vllm-openai-evil`` and ``ghcr.io/ggml-org/`` does not allow
``ghcr.io/ggml-org-evil/x``.

An allowed repository is not enough: an old release of an allowed engine lacks what
llmgw relies on (vLLM 0.10.2 renders a client's ``chat_template`` and follows media
URL redirects). So an engine's image must also name, in its tag, a release at or
above ``MINIMUM_RELEASES`` (``release_refusal``); a tag that names no release
(``latest``, ``nightly``, a pre-release) is refused like an old one. A digest decides
what runs whatever the tag beside it says, so an image pinned by digest is accepted
only when the operator vouches for that digest (``LLMGW_TRUSTED_IMAGE_DIGESTS``).

Must not: read the environment (``llmgw.render.settings`` does) or look at the catalog
(``llmgw.core.catalog.rules`` and the renderer ask it about one image).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from llmgw.core.catalog.model import Engine

DOCKER_HUB = "docker.io"
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?"
)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
# Docker refuses names longer than this (the repository, without tag or digest).
_MAX_NAME = 255


class ImageError(ValueError):
    """Text that is not an image reference (or allowlist entry) llmgw accepts."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    repository: str  # normal form: domain/path, e.g. docker.io/vllm/vllm-openai
    tag: str | None
    digest: str | None


def parse_image(text: str) -> ImageRef:
    """A Docker image reference in its normal form; ImageError saying what is wrong otherwise."""
    if not text or not text.isascii() or not text.isprintable() or text != text.strip():
        raise ImageError(f"{text[:80]!r} is not an image reference (printable ASCII, no spaces)")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise ImageError(f"{text!r}: a digest is written @sha256:<64 hex digits>")
    tag = None
    colon, slash = rest.rfind(":"), rest.rfind("/")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ImageError(f"{text!r}: {tag!r} is not a valid tag")
    return ImageRef(_repository(rest, text), tag, digest)


def _repository(name: str, shown: str) -> str:
    if len(name) > _MAX_NAME:
        raise ImageError(f"{shown[:80]!r}: a repository name is at most {_MAX_NAME} characters")
    domain, path = _split_domain(name)
    if not _DOMAIN.fullmatch(domain):
        raise ImageError(f"{shown!r}: {domain!r} is not a registry host[:port]")
    if not path or not all(_PATH_COMPONENT.fullmatch(part) for part in path.split("/")):
        raise ImageError(
            f"{shown!r}: repository path parts are lower-case letters and digits joined by . _ __ or -"
        )
    if domain == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return f"{domain}/{path}"


def _split_domain(name: str) -> tuple[str, str]:
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        domain = first.lower()
        return (DOCKER_HUB if domain in _DOCKER_HUB_ALIASES else domain), rest
    return DOCKER_HUB, name


def parse_allowed_image(entry: str) -> str:
    """An allowlist entry in normal form: a repository, or a prefix ending in ``/``."""
    if entry.endswith("/"):
        body = entry[:-1]
        first, sep, _ = body.partition("/")
        if not sep and ("." in first or ":" in first or first == "localhost"):
            # A whole registry: every repository it holds.
            domain = first.lower()
            if not _DOMAIN.fullmatch(domain):
                raise ImageError(f"allowed image prefix {entry!r}: {first!r} is not a registry host[:port]")
            return f"{DOCKER_HUB if domain in _DOCKER_HUB_ALIASES else domain}/"
        return _repository(body, entry) + "/"
    if "@" in entry or entry.rfind(":") > entry.rfind("/"):
        raise ImageError(
            f"allowed image {entry!r} names a tag or digest; allow its repository "
            "(any tag) or a prefix ending in /"
        )
    return _repository(entry, entry)


def parse_allowed_images(text: str) -> tuple[str, ...]:
    """``LLMGW_ALLOWED_IMAGES``: comma-separated entries (an empty text allows none)."""
    return tuple(parse_allowed_image(part.strip()) for part in text.split(",") if part.strip())


def default_allowed_images(images: Mapping[Engine, str]) -> tuple[str, ...]:
    """The repositories of the engines' default images: a catalog may pick another tag of them."""
    return tuple(sorted({parse_image(image).repository for image in images.values()}))


def image_refusal(image: str, allowed: Iterable[str]) -> str | None:
    """Why a catalog may not run ``image`` on this cluster, or None."""
    try:
        repository = parse_image(image).repository
    except ImageError as exc:
        return str(exc)
    for entry in allowed:
        if repository == entry or (entry.endswith("/") and repository.startswith(entry)):
            return None
    shown = ", ".join(allowed) or "none"
    return (
        f"image {image!r} ({repository}) is not from a repository this cluster allows ({shown}); "
        "leave image out to run the engine's default image, or ask the operator to add the "
        "repository to LLMGW_ALLOWED_IMAGES"
    )


# --- Engine releases -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Release:
    """An engine release as its image tag names it: (major, minor, patch, post) for vLLM
    and SGLang, (build,) for llama.cpp."""

    numbers: tuple[int, ...]
    shown: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.shown or ".".join(str(n) for n in self.numbers)


@dataclass(frozen=True, slots=True)
class MinimumRelease:
    release: Release
    # What an older release lacks that llmgw relies on (said in the refusal).
    because: str
    # A tag of this engine's that names the release, for the refusal's advice.
    example_tag: str


# vLLM: 0.11.0 refuses a request's chat_template without --trust-request-chat-template
# (serving_chat.py; 0.10.2 renders it unconditionally) and has VLLM_MEDIA_URL_ALLOW_REDIRECTS
# (envs.py; 0.10.2 follows every redirect of a media URL). SGLang: 0.5.3 is the release
# llmgw's engine policy was checked against (ServerArgs.add_cli_args). llama.cpp: the
# build the policy's flag table was audited for (common/arg.cpp of the commits that
# bracket it). The sources: ../shared/engines/*-flags.json and llmgw/render/DESIGN.md.
MINIMUM_RELEASES: Mapping[Engine, MinimumRelease] = MappingProxyType(
    {
        Engine.VLLM: MinimumRelease(
            Release((0, 11, 0, 0), "0.11.0"),
            "older releases render a chat_template sent with a request and follow media URL redirects",
            "v0.11.0",
        ),
        Engine.SGLANG: MinimumRelease(
            Release((0, 5, 3, 0), "0.5.3"),
            "llmgw's engine policy is checked against 0.5.3's flags; older releases parse others",
            "v0.5.3-cu129",
        ),
        Engine.LLAMACPP: MinimumRelease(
            Release((6700,), "b6700"),
            "llmgw's engine policy is checked against llama-server's flags from build b6700 on",
            "server-cuda-b6795",
        ),
    }
)

# v0.11.0, 0.11, v0.5.3.post1-cu129: numbers, then optionally a post release and a variant
# suffix. Pre-releases (0.11.0rc1, v0.5.3rc0-cu126) and dev builds are not releases.
_SEMVER_TAG = re.compile(r"v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?(?:\.post(\d{1,4}))?(?:-([A-Za-z0-9._-]+))?")
_PRERELEASE = re.compile(r"(?i)rc|dev|alpha|beta|pre|nightly")
# ghcr.io/ggml-org/llama.cpp: server-cuda-b6795, server-b6795, full-cuda12-b7903
# (.github/workflows/docker.yml: <full|light|server>[-<type>]-b<build number>); the
# light images hold no llama-server.
_LLAMACPP_TAG = re.compile(r"(?:server|full)(?:-[a-z0-9]+)*-b(\d{1,6})")


def tag_release(engine: Engine, tag: str | None) -> Release | None:
    """The release an image tag names for ``engine``, or None when it names none."""
    if tag is None:
        return None
    if engine is Engine.LLAMACPP:
        build = _LLAMACPP_TAG.fullmatch(tag)
        return Release((int(build.group(1)),), f"b{build.group(1)}") if build else None
    matched = _SEMVER_TAG.fullmatch(tag)
    if matched is None or (matched.group(5) and _PRERELEASE.search(matched.group(5))):
        return None
    major, minor, patch, post = (int(part) if part else 0 for part in matched.group(1, 2, 3, 4))
    return Release((major, minor, patch, post), f"{major}.{minor}.{patch}" + (f".post{post}" if post else ""))


def image_release(engine: Engine, image: str) -> Release | None:
    """The release ``image``'s tag names for ``engine``, or None (no release tag, not an image)."""
    try:
        return tag_release(engine, parse_image(image).tag)
    except ImageError:
        return None


def parse_trusted_digests(text: str) -> tuple[str, ...]:
    """``LLMGW_TRUSTED_IMAGE_DIGESTS``: comma-separated ``sha256:<64 hex>`` the operator vouches for."""
    digests = tuple(part.strip() for part in text.split(",") if part.strip())
    for digest in digests:
        if not _DIGEST.fullmatch(digest):
            raise ImageError(f"{digest[:80]!r} is not an image digest (sha256:<64 hex digits>)")
    return digests


def release_refusal(image: str, engine: Engine, trusted_digests: Iterable[str] = ()) -> str | None:
    """Why ``image`` may not run ``engine`` (a release older than llmgw needs, or unknown), or None."""
    minimum = MINIMUM_RELEASES.get(engine)
    if minimum is None:
        return None  # the simulator runs no image
    try:
        ref = parse_image(image)
    except ImageError as exc:
        return str(exc)
    need = f"{engine.value} {minimum.release} or later"
    if ref.digest is not None:
        if ref.digest in set(trusted_digests):
            return None
        return (
            f"image {image!r} is pinned by a digest, which decides what runs whatever its tag says, "
            f"so llmgw cannot tell its {engine.value} release; name a release tag ({need}, such as "
            f"{minimum.example_tag!r}), or have the operator check the image is {need} and add "
            f"{ref.digest} to LLMGW_TRUSTED_IMAGE_DIGESTS"
        )
    release = tag_release(engine, ref.tag)
    if release is None:
        return (
            f"image {image!r}: the tag {ref.tag or 'latest'!r} names no {engine.value} release llmgw can "
            f"read, and llmgw needs {need}; name a release tag such as {minimum.example_tag!r}, or pin "
            "a digest the operator trusts (LLMGW_TRUSTED_IMAGE_DIGESTS)"
        )
    if release < minimum.release:
        return (
            f"image {image!r} is {engine.value} {release}, and llmgw needs {need} ({minimum.because}); "
            f"name a newer release such as {minimum.example_tag!r}"
        )
    return None
