"""What a chat profile's engine is told so it answers requests with tools, as rendered.

Every chat profile of ``examples/catalog.yaml`` (the golden ``jobspecs/`` are its render,
held to it by ``test_golden_jobspecs``) renders a tool-call parser its engine release
registers (``llmgw/apispec/engines/engine-parsers.json``, read from the release's wheel),
vLLM with ``--enable-auto-tool-choice``; llama.cpp gets ``--jinja`` where the build does
not default to it; a two-node SGLang replica waits in torch's rendezvous as long as the
control plane waits for it (``--dist-timeout``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmgw.apispec.engine_parsers import parser_registry
from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.core.catalog.images import image_release
from llmgw.core.catalog.model import Engine, Role
from llmgw.core.catalog.tool_calling import registry_for
from llmgw.render import DEFAULT_IMAGES

from .test_rendered_argv_against_engine_tables import _render, invocations

REPO = Path(__file__).resolve().parents[3]


def _value(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _engine_argv(policy: SecurityPolicy, text: str, model: str = "m", profile: int = 0) -> tuple[str, ...]:
    loaded = load_catalog(text, filename="c", policy=policy)
    assert loaded.catalog is not None, loaded.diagnostics
    engine_profile = loaded.catalog.models[model].profiles[profile]
    image = engine_profile.image or DEFAULT_IMAGES[engine_profile.engine]
    found = invocations(_render(policy, loaded.catalog, model, profile), engine_profile.engine, image)
    return next(i.argv for i in found if i.table.program != "ray start")


def test_every_chat_profile_of_the_example_catalog_renders_a_parser_its_release_registers(
    shipped_policy: SecurityPolicy,
) -> None:
    text = (REPO / "examples" / "catalog.yaml").read_text(encoding="utf-8")
    catalog = load_catalog(text, filename="examples/catalog.yaml", policy=shipped_policy).catalog
    assert catalog is not None
    checked = 0
    for name, model in catalog.models.items():
        if Role.CHAT not in model.roles:
            continue
        for index, profile in enumerate(model.profiles):
            if profile.engine is Engine.SIM:
                continue
            image = profile.image or DEFAULT_IMAGES[profile.engine]
            release = image_release(profile.engine, image)
            assert release is not None, image
            job = _render(shipped_policy, catalog, name, index)
            argv = next(
                i.argv for i in invocations(job, profile.engine, image) if i.table.program != "ray start"
            )
            if profile.engine is Engine.LLAMACPP:
                needs_jinja = release.numbers < (11434,)
                assert ("--jinja" in argv) == needs_jinja, (name, release, argv)
                checked += 1
                continue
            parsers = registry_for(profile.engine, release, parser_registry())
            assert parsers is not None, (profile.engine, release)
            parser = _value(argv, "--tool-call-parser")
            assert parser in parsers.tool_call, (name, release, parser)
            if profile.engine is Engine.VLLM:
                assert "--enable-auto-tool-choice" in argv, (name, argv)
            reasoning = _value(argv, "--reasoning-parser")
            assert reasoning is None or reasoning in parsers.reasoning, (name, reasoning)
            checked += 1
    assert checked >= 5


def _catalog(profile: dict[str, object], roles: tuple[str, ...] = ("chat",)) -> str:
    return yaml.safe_dump({"models": {"m": {"roles": list(roles), "profiles": [profile]}}})


@pytest.mark.parametrize(
    ("image", "jinja"),
    [
        ("ghcr.io/ggml-org/llama.cpp:server-cuda-b6795", True),
        ("ghcr.io/ggml-org/llama.cpp:server-cuda-b6700", True),
    ],
)
def test_llama_server_gets_jinja_where_its_build_does_not_default_to_it(
    shipped_policy: SecurityPolicy, image: str, jinja: bool
) -> None:
    source = "https://huggingface.co/org/m-GGUF/resolve/main/m.gguf"
    argv = _engine_argv(shipped_policy, _catalog({"engine": "llamacpp", "source": source, "image": image}))
    assert ("--jinja" in argv) is jinja
    # An embedding model is told nothing of chat.
    embed = _catalog({"engine": "llamacpp", "source": source, "image": image}, ("embedding",))
    assert "--jinja" not in _engine_argv(shipped_policy, embed)


def test_vllm_gets_the_family_parser_and_a_reasoning_parser_for_a_reasoning_model(
    shipped_policy: SecurityPolicy,
) -> None:
    argv = _engine_argv(shipped_policy, _catalog({"engine": "vllm", "source": "Qwen/Qwen3-8B"}))
    assert _value(argv, "--tool-call-parser") == "hermes"
    assert "--enable-auto-tool-choice" in argv
    assert _value(argv, "--reasoning-parser") == "qwen3"
    declared = _catalog({"engine": "vllm", "source": "org/m", "tool_call_parser": "pythonic"})
    assert _value(_engine_argv(shipped_policy, declared), "--tool-call-parser") == "pythonic"
    unknown = _engine_argv(shipped_policy, _catalog({"engine": "vllm", "source": "org/m"}))
    assert "--tool-call-parser" not in unknown and "--enable-auto-tool-choice" not in unknown
    # The operator's own parser in args is not rendered twice.
    own = _catalog({"engine": "vllm", "source": "Qwen/Qwen3-8B", "args": ["--tool-call-parser", "qwen3_xml"]})
    own_argv = _engine_argv(shipped_policy, own)
    assert own_argv.count("--tool-call-parser") == 1 and _value(own_argv, "--tool-call-parser") == "qwen3_xml"


def test_sglang_gets_its_own_spelling_of_the_family_parser(shipped_policy: SecurityPolicy) -> None:
    argv = _engine_argv(shipped_policy, _catalog({"engine": "sglang", "source": "deepseek-ai/DeepSeek-R1"}))
    assert (_value(argv, "--tool-call-parser"), _value(argv, "--reasoning-parser")) == (
        "deepseekv3",
        "deepseek-r1",
    )
    none = _catalog({"engine": "sglang", "source": "deepseek-ai/DeepSeek-R1", "tool_call_parser": "none"})
    assert "--tool-call-parser" not in _engine_argv(shipped_policy, none)


@pytest.mark.parametrize(("load_timeout", "expected"), [(None, "1800"), ("1h", "3600"), ("5m", "900")])
def test_a_two_node_sglang_replica_waits_in_torchs_rendezvous_as_long_as_the_control_plane(
    shipped_policy: SecurityPolicy, load_timeout: str | None, expected: str
) -> None:
    # The longer of the placement timeout (15 min: the last rank's image pull) and the load
    # timeout (SGLang's default 30 min, or the profile's).
    profile: dict[str, object] = {"engine": "sglang", "source": "org/m", "tp": 16, "nodes": 2}
    if load_timeout is not None:
        profile["load_timeout"] = load_timeout
    argv = _engine_argv(shipped_policy, _catalog(profile))
    assert _value(argv, "--dist-timeout") == expected
    one_node = _engine_argv(shipped_policy, _catalog({"engine": "sglang", "source": "org/m"}))
    assert "--dist-timeout" not in one_node
    own = _catalog({**profile, "args": ["--dist-timeout", "7200"]})
    assert _engine_argv(shipped_policy, own).count("--dist-timeout") == 1
