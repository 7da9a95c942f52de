"""A catalog's `image` picks the code that runs as root on a node: only the operator's repositories pass."""

from __future__ import annotations

import json

import pytest

from llmgw.core.catalog import Catalog, SecurityPolicy, catalog_digest, load_catalog
from llmgw.core.catalog.images import ImageError, image_refusal, parse_allowed_images, parse_image
from llmgw.core.diagnostics import format_path
from llmgw.render import Renderer, RenderError, RenderSettings, ReplicaRequest
from llmgw.render.settings import DEFAULT_ALLOWED_IMAGES, RenderSettingsError, render_settings_from_env


def catalog_text(image: str, engine: str = "vllm") -> str:
    source = "org/model" if engine != "llamacpp" else "https://example.org/m.gguf"
    return f"""
models:
  m:
    profiles:
      - {{engine: {engine}, source: {source}, image: {json.dumps(image)}}}
    scaling: {{min: 1, max: 1}}
"""


def catalog(policy: SecurityPolicy, image: str, engine: str = "vllm") -> Catalog:
    text = catalog_text(image, engine)
    loaded = load_catalog(text, filename="c.yaml", policy=policy)
    assert loaded.catalog is not None, loaded.diagnostics
    return loaded.catalog


def render(policy: SecurityPolicy, image: str, settings: RenderSettings | None = None) -> str:
    renderer = Renderer(settings or RenderSettings(), policy)
    loaded = catalog(policy, image)
    rendered = renderer.render(loaded, ReplicaRequest("m", 0, "0"), catalog_hash=catalog_digest(loaded))
    job = renderer.check(rendered, model="m")
    images = {task["Config"]["image"] for group in job["TaskGroups"] for task in group["Tasks"]}
    assert len(images) == 1
    return str(images.pop())


def test_the_default_images_repositories_are_allowed_with_any_tag_or_digest(
    shipped_policy: SecurityPolicy,
) -> None:
    assert DEFAULT_ALLOWED_IMAGES == (
        "docker.io/lmsysorg/sglang",
        "docker.io/vllm/vllm-openai",
        "ghcr.io/ggml-org/llama.cpp",
    )
    digest = "sha256:" + "a" * 64
    for image in (
        "vllm/vllm-openai:v0.12.0",
        "docker.io/vllm/vllm-openai:nightly",
        "index.docker.io/vllm/vllm-openai",
        f"vllm/vllm-openai@{digest}",
        f"vllm/vllm-openai:v0.12.0@{digest}",
    ):
        assert render(shipped_policy, image) == image


@pytest.mark.parametrize(
    "image",
    [
        "attacker/vllm:latest",  # any other repository
        "vllm/vllm-openai-evil:latest",  # a repository whose name starts like an allowed one
        "vllm/vllm-openai/evil:latest",  # a repository under an allowed one is another repository
        "ghcr.io/ggml-org/llama.cpp.evil:x",
        "ghcr.io.evil.example/ggml-org/llama.cpp:server",  # a registry whose name starts like an allowed one
        "evil.example/vllm/vllm-openai:v1",  # the same path on another registry
        "localhost:5000/vllm/vllm-openai:v1",
        "ubuntu",
        "library/ubuntu:22.04",
        "VLLM/vllm-openai:v1",  # upper case is not a repository at all
        "vllm/vllm-openai:v1 ",
        "vllm/vllm-openai:v1\n",
        "vllm/vllm-openai\u200b:v1",  # zero-width space
        "ｖllm/vllm-openai:v1",  # full-width letter
        "vllm/vllm-openai:latest@sha256:short",
        "vllm//vllm-openai",
        "../vllm/vllm-openai",
        "vllm/vllm-openai:" + "x" * 200,
        "a/" * 200 + "b",
    ],
)
def test_any_other_image_is_refused_before_anything_is_submitted(
    shipped_policy: SecurityPolicy, image: str
) -> None:
    loaded = catalog(shipped_policy, image)
    with pytest.raises(RenderError, match="model 'm' profile 0: "):
        Renderer(RenderSettings(), shipped_policy).render(
            loaded, ReplicaRequest("m", 0, "0"), catalog_hash="h"
        )


def test_the_refusal_says_what_to_do(shipped_policy: SecurityPolicy) -> None:
    with pytest.raises(RenderError) as refused:
        render(shipped_policy, "attacker/vllm:latest")
    message = str(refused.value)
    assert "model 'm' profile 0" in message
    assert "docker.io/attacker/vllm" in message
    assert "leave image out" in message and "LLMGW_ALLOWED_IMAGES" in message


def test_where_catalogs_come_in_the_image_is_refused_with_the_renderers_words(
    shipped_policy: SecurityPolicy,
) -> None:
    # `llmgw catalog check` and the admin API's diff and apply load with the allowlists:
    # an image the renderer would refuse is an error at its key, not a model that CI's
    # apply reports as started and that never places.
    settings = RenderSettings()
    text = catalog_text("attacker/vllm:latest")
    loaded = load_catalog(text, filename="c.yaml", policy=shipped_policy, allowlists=settings.allowlists)
    assert loaded.catalog is None
    [diagnostic] = loaded.errors
    assert format_path(diagnostic.path) == "models.m.profiles[0].image"
    assert diagnostic.position is not None and diagnostic.position.line == 5
    with pytest.raises(RenderError) as refused:
        render(shipped_policy, "attacker/vllm:latest", settings)
    assert str(refused.value) == f"model 'm' profile 0: {diagnostic.message}"
    # The allowed ones load alike, and loads without allowlists (the applied catalog's
    # readers) leave the image to the renderer.
    allowed = load_catalog(
        catalog_text("vllm/vllm-openai:v0.12.0"), filename="c.yaml", policy=shipped_policy,
        allowlists=settings.allowlists,
    )  # fmt: skip
    assert allowed.ok, allowed.diagnostics
    assert load_catalog(text, filename="c.yaml", policy=shipped_policy).ok


def test_the_operators_own_registry_by_prefix(shipped_policy: SecurityPolicy) -> None:
    allowed = parse_allowed_images("registry.example.com:5000/llm/, vllm/vllm-openai")
    settings = RenderSettings(allowed_images=allowed)
    assert render(shipped_policy, "registry.example.com:5000/llm/vllm:0.12", settings) == (
        "registry.example.com:5000/llm/vllm:0.12"
    )
    assert render(shipped_policy, "registry.example.com:5000/llm/team/sglang:1", settings)
    for image in (
        "registry.example.com:5000/llm-evil/vllm:1",
        "registry.example.com:5000/other/vllm:1",
        "registry.example.com/llm/vllm:1",  # another port is another registry
        "registry.example.com:5000/llm",  # the prefix itself is not under it
        "lmsysorg/sglang:v1",  # no longer in the list
    ):
        assert image_refusal(image, settings.allowed_images) is not None, image


def test_a_whole_registry_and_none() -> None:
    assert parse_allowed_images("Registry.Example.com/") == ("registry.example.com/",)
    assert image_refusal("registry.example.com/any/thing:1", ("registry.example.com/",)) is None
    assert image_refusal("registry.example.com.evil.io/any/thing:1", ("registry.example.com/",))
    assert parse_allowed_images("") == ()
    assert image_refusal("vllm/vllm-openai:v1", ()) is not None


@pytest.mark.parametrize(
    "entry", ["vllm/vllm-openai:v1", "vllm/vllm-openai@sha256:" + "a" * 64, "Bad Entry", "a//b", "/"]
)
def test_an_allowlist_entry_names_a_repository_or_a_prefix(entry: str) -> None:
    with pytest.raises(ImageError):
        parse_allowed_images(entry)


def test_llmgw_allowed_images_from_the_environment() -> None:
    def allowed(environ: dict[str, str]) -> tuple[str, ...]:
        return render_settings_from_env(environ).allowed_images

    assert allowed({}) == DEFAULT_ALLOWED_IMAGES
    assert allowed({"LLMGW_ALLOWED_IMAGES": "reg.example/llm/, ubuntu"}) == (
        "reg.example/llm/",
        "docker.io/library/ubuntu",
    )
    assert allowed({"LLMGW_ALLOWED_IMAGES": ""}) == ()
    with pytest.raises(RenderSettingsError, match="LLMGW_ALLOWED_IMAGES"):
        allowed({"LLMGW_ALLOWED_IMAGES": "vllm/vllm-openai:v1"})


def test_normal_form() -> None:
    assert parse_image("ubuntu").repository == "docker.io/library/ubuntu"
    assert parse_image("localhost:5000/a/b:c").repository == "localhost:5000/a/b"
    assert parse_image("localhost/a").repository == "localhost/a"
    assert parse_image("my_org__x/a-b.c_d:1.0").repository == "docker.io/my_org__x/a-b.c_d"
