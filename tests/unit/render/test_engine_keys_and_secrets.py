"""Secrets reach engines only through Nomad: what the rendered jobs say, and what they never hold."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.core.engine_keys import EngineKeys, EngineKeySecretError, variable_path
from llmgw.flags import ENGINE_KEY_SECRET, SettingError
from llmgw.render import Renderer, RenderSettings, ReplicaRequest
from llmgw.render.settings import RenderSettingsError, render_settings_from_env

ENGINES = {
    "vllm": "{engine: vllm, source: org/m, tp: 8, pp: 2, nodes: 2}",
    "sglang": "{engine: sglang, source: org/m, tp: 8, nodes: 2}",
    "llamacpp": "{engine: llamacpp, source: 'https://files.example.com/m.gguf'}",
    "sim": "{engine: sim, tp: 16, nodes: 2}",
}


def _groups(engine: str, settings: RenderSettings, policy: SecurityPolicy) -> tuple[str, list[dict]]:  # type: ignore[type-arg]
    text = f"models:\n  m:\n    profiles: [{ENGINES[engine]}]\n"
    catalog = load_catalog(text, filename="c", policy=policy).catalog
    assert catalog is not None
    renderer = Renderer(settings, policy)
    fabric = "f" if "nodes: 2" in ENGINES[engine] else None
    rendered = renderer.render(catalog, ReplicaRequest("m", 0, "r1", fabric), catalog_hash="h")
    return rendered.hcl, renderer.check(rendered, model="m")["TaskGroups"]


def _engine_task(group: dict) -> dict:  # type: ignore[type-arg]
    return next(t for t in group["Tasks"] if t["Name"] == "engine")


# Where each engine reads its key at the pinned releases (llmgw/render/DESIGN.md).
KEY_IN_ENV = {"vllm": "VLLM_API_KEY", "llamacpp": "LLAMA_API_KEY", "sim": "VLLM_API_KEY"}


def _job_id(hcl: str) -> str:
    return "llmgw-" + hcl.split('job "llmgw-', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_rank_0_requires_the_key_its_own_variable_holds_and_no_argv_carries_it(
    engine: str, shipped_policy: SecurityPolicy
) -> None:
    hcl, groups = _groups(engine, RenderSettings(engine_api_keys=True), shipped_policy)
    variable = variable_path(_job_id(hcl))
    rank0 = _engine_task(groups[0])
    args = rank0["Config"]["args"]
    assert not [word for word in args if "api-key" in word or "API_KEY" in word or "engine_api_key" in word]
    assert "API_KEY" not in str(rank0.get("Env") or {})
    [template] = [t for t in rank0["Templates"] if t["DestPath"].startswith("secrets/engine-key.")]
    if engine in KEY_IN_ENV:
        assert template["DestPath"] == "secrets/engine-key.env"
        assert template["Envvars"] is True
        key_line = f"{KEY_IN_ENV[engine]}={{{{ .engine_api_key }}}}"
        assert template["EmbeddedTmpl"] == f'{{{{ with nomadVar "{variable}" }}}}{key_line}{{{{ end }}}}\n'
    else:  # SGLang reads no variable: the key is in the YAML file --config names.
        assert template["DestPath"] == "secrets/engine-key.yaml"
        assert template["Envvars"] is False
        assert template["EmbeddedTmpl"] == (
            f'{{{{ with nomadVar "{variable}" }}}}api-key: "{{{{ .engine_api_key }}}}"{{{{ end }}}}\n'
        )
        assert args[-2:] == ["--config", "${NOMAD_SECRETS_DIR}/engine-key.yaml"]
    for worker in groups[1:]:
        task = _engine_task(worker)
        assert "--config" not in task["Config"]["args"]
        assert not [t for t in task.get("Templates") or [] if "engine-key" in t["DestPath"]]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_catalog_cannot_give_an_engine_a_key_of_its_own(
    engine: str, shipped_policy: SecurityPolicy
) -> None:
    """Where llmgw puts the key is llmgw's: a profile's env or args naming it are refused."""
    profile = ENGINES[engine].rstrip("}")
    tries = [f"env: {{{variable}: k}}" for variable in ("VLLM_API_KEY", "LLAMA_API_KEY")]
    tries.append("args: [--api-key, k]")
    if engine == "sglang":
        tries.append("args: [--config, /tmp/k.yaml]")
    if engine == "llamacpp":
        tries += ["args: [--api-key-file, /tmp/k]", "env: {LLAMA_ARG_API_KEY_FILE: /tmp/k}"]
    for attempt in tries:
        text = f"models:\n  m:\n    profiles: [{profile}, {attempt}}}]\n"
        assert load_catalog(text, filename="c", policy=shipped_policy).catalog is None, attempt


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_without_keys_or_token_no_secret_template_is_rendered(
    engine: str, shipped_policy: SecurityPolicy
) -> None:
    hcl = _groups(engine, RenderSettings(), shipped_policy)[0]
    assert "nomadVar" not in hcl and "--api-key" not in hcl


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_rank_reads_hf_token_from_the_operators_variable(
    engine: str, shipped_policy: SecurityPolicy
) -> None:
    _hcl, groups = _groups(engine, RenderSettings(hf_token_variable="llmgw/hf-token"), shipped_policy)
    for group in groups:
        [template] = [t for t in _engine_task(group)["Templates"] if t["DestPath"] == "secrets/hf-token.env"]
        assert (
            template["EmbeddedTmpl"]
            == '{{ with nomadVar "llmgw/hf-token" }}HF_TOKEN={{ .HF_TOKEN }}{{ end }}\n'
        )
        assert template["Envvars"] is True
        assert "HF_TOKEN" not in (_engine_task(group).get("Env") or {})


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('llmgw/hf" }}{{ env "HOME', "is not a Nomad Variable path"),
        ("nomad/jobs/x", "Nomad reserves"),
        ("a//b", "is not a Nomad Variable path"),
        ("x" * 129, "is not a Nomad Variable path"),
    ],
)
def test_the_token_variable_setting_refuses_what_is_not_a_path(value: str, words: str) -> None:
    with pytest.raises(RenderSettingsError, match=words):
        render_settings_from_env({"LLMGW_HF_TOKEN_VARIABLE": value})


def test_the_settings_come_from_the_environment() -> None:
    settings = render_settings_from_env(
        {"LLMGW_HF_TOKEN_VARIABLE": "/llmgw/hf-token/", "LLMGW_ENGINE_KEY_SECRET": "x" * 40}
    )
    assert settings.hf_token_variable == "llmgw/hf-token"
    assert settings.engine_api_keys
    assert not render_settings_from_env({}).engine_api_keys


def test_keys_are_per_replica_derived_and_the_secret_is_never_shown() -> None:
    keys = EngineKeys("k" * 32)
    assert keys.for_replica("llmgw-a-1") == keys.for_replica("llmgw-a-1")
    assert keys.for_replica("llmgw-a-1") != keys.for_replica("llmgw-a-2")
    assert keys.for_replica("llmgw-a-1") != EngineKeys("j" * 32).for_replica("llmgw-a-1")
    assert "k" * 32 not in repr(keys)
    with pytest.raises(EngineKeySecretError, match="at least 32"):
        EngineKeys("short")
    assert ENGINE_KEY_SECRET.read({}) is None
    assert ENGINE_KEY_SECRET.read({"LLMGW_ENGINE_KEY_SECRET": "  "}) is None
    assert ENGINE_KEY_SECRET.read({"LLMGW_ENGINE_KEY_SECRET": "k" * 32}) == keys
    with pytest.raises(SettingError, match="at least 32") as refused:
        ENGINE_KEY_SECRET.read({"LLMGW_ENGINE_KEY_SECRET": "short-secret"})
    assert "LLMGW_ENGINE_KEY_SECRET" in str(refused.value)
    assert "short-secret" not in str(refused.value)  # a secret is never repeated
