"""serve and render read the cluster's rendering settings from the same variables."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import Engine
from llmgw.render.settings import (
    DEFAULT_IMAGES,
    RenderSettings,
    RenderSettingsError,
    render_settings_from_env,
)


def test_nothing_set_is_the_defaults() -> None:
    assert render_settings_from_env({}) == RenderSettings()


def test_every_variable_is_read() -> None:
    settings = render_settings_from_env(
        {
            "LLMGW_DATACENTERS": "dc1,dc2",
            "NOMAD_REGION": "eu",
            "NOMAD_NAMESPACE": "llm",
            "LLMGW_NODE_POOL": "gpu",
            "LLMGW_NODE_COMMAND": "/opt/llmgw/bin/llmgw --quiet",
            "LLMGW_MIRROR_URL": "http://mirror:8900",
            "LLMGW_MODEL_CACHE_DIR": "/data/models",
            "LLMGW_IMAGE_VLLM": "registry.internal/vllm/vllm-openai:v0.11.0",
            "LLMGW_TEMPLATES": "/etc/llmgw/templates",
            "LLMGW_SOURCE_ALLOWED_NETWORKS": "10.20.0.0/16, fd12:3456::/48",
            "LLMGW_TRUSTED_IMAGE_DIGESTS": "sha256:" + "e" * 64,
        }
    )
    assert settings.datacenters == ("dc1", "dc2")
    assert (settings.region, settings.namespace, settings.node_pool) == ("eu", "llm", "gpu")
    assert settings.llmgw_command == ("/opt/llmgw/bin/llmgw", "--quiet")
    assert settings.mirror_url == "http://mirror:8900" and settings.model_cache_dir == "/data/models"
    assert settings.images[Engine.VLLM] == "registry.internal/vllm/vllm-openai:v0.11.0"
    assert settings.images[Engine.SGLANG] == DEFAULT_IMAGES[Engine.SGLANG]
    # An operator's own image registry is allowed for catalogs too, unless they say otherwise.
    assert any("registry.internal/vllm/vllm-openai" in allowed for allowed in settings.allowed_images)
    assert str(settings.templates_dir) == "/etc/llmgw/templates"
    assert [str(n) for n in settings.source_allowed_networks] == ["10.20.0.0/16", "fd12:3456::/48"]
    assert settings.allowlists.source_networks == settings.source_allowed_networks
    assert settings.allowlists.trusted_image_digests == ("sha256:" + "e" * 64,)
    assert settings.allowlists.images == settings.allowed_images


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLMGW_ALLOWED_IMAGES", "not a ref"),
        ("LLMGW_NODE_COMMAND", "llmgw 'unclosed"),
        ("LLMGW_SOURCE_ALLOWED_NETWORKS", "10.20.0.5/16"),
        ("LLMGW_SOURCE_ALLOWED_NETWORKS", "files.internal"),
    ],
)
def test_an_unusable_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(RenderSettingsError, match=name):
        render_settings_from_env({name: value})


def test_the_model_cache_volume_is_named_or_switched_off() -> None:
    assert render_settings_from_env({}).model_cache_volume == "llmgw-models"
    assert render_settings_from_env({"LLMGW_MODEL_CACHE_VOLUME": "hf"}).model_cache_volume == "hf"
    assert render_settings_from_env({"LLMGW_MODEL_CACHE_VOLUME": ""}).model_cache_volume is None


def test_the_nvidia_runtime_is_the_docker_plugins_default_unless_renamed() -> None:
    assert render_settings_from_env({}).nvidia_runtime == "nvidia"
    assert render_settings_from_env({"LLMGW_NVIDIA_RUNTIME": " nvidia-gpu "}).nvidia_runtime == "nvidia-gpu"
    with pytest.raises(
        RenderSettingsError, match="LLMGW_NVIDIA_RUNTIME='nvidia,runc' is not a Docker runtime name"
    ):
        render_settings_from_env({"LLMGW_NVIDIA_RUNTIME": "nvidia,runc"})
