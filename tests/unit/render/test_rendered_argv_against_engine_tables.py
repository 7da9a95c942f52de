"""Every argv llmgw renders, parsed as the engine release its image pins would parse it.

Each job is rendered through the real templates (every engine, one node and two, every
role, a Hub or URL source and a mirror: one, the default images and the example
catalog's pins) and parsed as Nomad would; every engine program found in a task's
command (``vllm serve``, ``ray start``, ``python3 -m sglang.launch_server``,
``llama-server``, also inside an ``sh -c`` script) is checked against the vendored
table of that release: an unknown flag, a missing or extra value fails. Whatever a
template or an engine module adds is picked up here. And what policies/README.md says
llmgw sets in the engines' environment is there.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw.apispec.engine_flags import ProgramTable, check_argv, ray_start_table, tables_for_image
from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.catalog.images import parse_image, tag_release
from llmgw.core.catalog.model import ENGINES_SPANNING_NODES, Engine, Role
from llmgw.core.engines.vllm import NATIVE_MULTI_NODE
from llmgw.render import DEFAULT_CPU_IMAGES, DEFAULT_IMAGES, Renderer, RenderSettings, ReplicaRequest

REPO = Path(__file__).resolve().parents[3]

# Where each engine program starts in a command: the words that name it.
PROGRAMS: dict[Engine, tuple[str, ...]] = {
    Engine.VLLM: ("vllm", "serve"),
    Engine.SGLANG: ("python3", "-m", "sglang.launch_server"),
    Engine.LLAMACPP: ("/app/llama-server",),
}
RAY_START = ("ray", "start")
# Older supported releases, each rendered against its own vendored table beside the
# defaults (every release at or above the engine's minimum that has a table), and
# llama.cpp's CPU server image. vLLM 0.10.2's table stays vendored (the audit read it), but
# its image is below vLLM's minimum release and renders nothing
# (llmgw/core/catalog/images.py).
EXTRA_IMAGES: dict[Engine, tuple[str, ...]] = {
    Engine.VLLM: ("vllm/vllm-openai:v0.11.0",),
    Engine.SGLANG: ("lmsysorg/sglang:v0.5.3-cu129",),
    Engine.LLAMACPP: ("ghcr.io/ggml-org/llama.cpp:server-cuda-b6795", DEFAULT_CPU_IMAGES[Engine.LLAMACPP]),
}


@dataclass(frozen=True)
class Invocation:
    where: str
    table: ProgramTable
    argv: tuple[str, ...]


def _program_runs(words: Sequence[str], engine: Engine) -> Iterator[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(program, its argv) for each engine program in one command; an argv ends at ``&&``."""
    markers = (PROGRAMS[engine], RAY_START) if engine is Engine.VLLM else (PROGRAMS[engine],)
    index = 0
    while index < len(words):
        marker = next((m for m in markers if tuple(words[index : index + len(m)]) == m), None)
        if marker is None:
            index += 1
            continue
        end = index + len(marker)
        while end < len(words) and words[end] not in ("&&", "||", ";"):
            end += 1
        yield marker, tuple(words[index + len(marker) : end])
        index = end


def _commands(argv: Sequence[str]) -> Iterator[list[str]]:
    """The command itself, and each ``sh -c`` script in it with its ``$1``.. filled in."""
    yield list(argv)
    if len(argv) >= 3 and argv[0].endswith("sh") and argv[1] == "-c":
        script, positional = argv[2], list(argv[3:])  # $0, $1, ...
        words: list[str] = []
        for word in shlex.split(script):
            if word.startswith("$") and word[1:].isdigit():
                words.append(positional[int(word[1:])])
            else:
                words.append(word)
        yield words


def invocations(job: dict[str, Any], engine: Engine, image: str) -> list[Invocation]:
    tables = tables_for_image(engine, image)
    found = []
    for group in job["TaskGroups"]:
        for task in group["Tasks"]:
            config = task.get("Config") or {}
            head = config.get("entrypoint") or ([config["command"]] if "command" in config else [])
            argv = [*head, *(config.get("args") or [])]
            for command in _commands(argv):
                for program, program_argv in _program_runs(command, engine):
                    chosen = (ray_start_table(),) if program == RAY_START else tables
                    where = f"{job['ID']} {group['Name']}/{task['Name']} {' '.join(program)}"
                    found += [Invocation(where, table, program_argv) for table in chosen]
    return found


def _profile_lines(
    engine: Engine, nodes: int, image: str, role: Role, args: Sequence[str] = (), *, mirrored: bool = False
) -> str:
    profile: dict[str, Any] = {"engine": engine.value, "image": image, "args": list(args)}
    if engine is Engine.LLAMACPP:
        profile["source"] = "https://huggingface.co/org/m-GGUF/resolve/main/m-q4_k_m.gguf"
    else:
        profile |= {"source": "org/m", "tp": 8, "nodes": nodes}
    if mirrored:
        profile["source"] = "mirror:m@v1"
    return yaml.safe_dump({"models": {"m": {"roles": [role.value], "profiles": [profile]}}})


def _cases() -> Iterator[tuple[Engine, int, str, Role, bool]]:
    for engine in PROGRAMS:
        for image in (DEFAULT_IMAGES[engine], *EXTRA_IMAGES.get(engine, ())):
            for nodes in (1, 2) if engine in ENGINES_SPANNING_NODES else (1,):
                for role in Role:
                    for mirrored in (False, True):
                        yield engine, nodes, image, role, mirrored


# Where llmgw's mirror serves model files: a mirror: source fetches from it before the engine starts.
MIRROR = RenderSettings(mirror_url="http://mirror.example:8900")


def _render(policy: SecurityPolicy, catalog: Catalog, model: str, profile: int) -> dict[str, Any]:
    renderer = Renderer(MIRROR, policy)
    nodes = catalog.models[model].profiles[profile].node_count
    request = ReplicaRequest(model, profile, "0", "fabric-a" if nodes > 1 else None)
    return renderer.check(renderer.render(catalog, request, catalog_hash="h"), model=model)


def assert_known_to_the_engine(found: list[Invocation]) -> None:
    assert found, "no engine program found in the rendered job"
    problems = [f"{i.where} ({i.table.release}): {p}" for i in found for p in check_argv(i.table, i.argv)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("engine", "nodes", "image", "role", "mirrored"),
    list(_cases()),
    ids=[f"{e}-{n}node-{i.rsplit(':', 1)[-1]}-{r}{'-mirror' * m}" for e, n, i, r, m in _cases()],
)
def test_every_rendered_engine_argv_is_known_to_the_pinned_release(
    shipped_policy: SecurityPolicy, engine: Engine, nodes: int, image: str, role: Role, mirrored: bool
) -> None:
    text = _profile_lines(engine, nodes, image, role, mirrored=mirrored)
    loaded = load_catalog(text, filename="c", policy=shipped_policy)
    assert loaded.catalog is not None, loaded.diagnostics
    job = _render(shipped_policy, loaded.catalog, "m", 0)
    found = invocations(job, engine, image)
    if engine is Engine.VLLM and nodes > 1:
        release = tag_release(engine, parse_image(image).tag)
        assert release is not None
        # 0.34.0 on: a vllm serve on every rank; before: Ray workers and a Ray head.
        native = release >= NATIVE_MULTI_NODE
        assert {i.table.program for i in found} == ({"vllm serve"} if native else {"vllm serve", "ray start"})
        assert len([i for i in found if i.table.program == "vllm serve"]) == (nodes if native else 1)
    assert {i.table.release for i in found if i.table.program != "ray start"} <= {
        t.release for t in tables_for_image(engine, image)
    }
    assert_known_to_the_engine(found)


@pytest.mark.parametrize(
    ("engine", "old_image", "old_release"),
    [
        (Engine.VLLM, "vllm/vllm-openai:v0.11.0", "0.11.0"),
        (Engine.SGLANG, "lmsysorg/sglang:v0.5.3-cu129", "0.5.3"),
        (Engine.LLAMACPP, "ghcr.io/ggml-org/llama.cpp:server-cuda-b6795", "4227c9be"),
    ],
)
def test_an_old_release_renders_against_its_own_table_and_the_default_against_the_new(
    shipped_policy: SecurityPolicy, engine: Engine, old_image: str, old_release: str
) -> None:
    new_release = {Engine.VLLM: "0.34.0", Engine.SGLANG: "0.5.23", Engine.LLAMACPP: "b11434"}[engine]
    nodes = 2 if engine in ENGINES_SPANNING_NODES else 1
    for image, release in ((old_image, old_release), (DEFAULT_IMAGES[engine], new_release)):
        catalog = load_catalog(
            _profile_lines(engine, nodes, image, Role.CHAT), filename="c", policy=shipped_policy
        ).catalog
        assert catalog is not None
        job = _render(shipped_policy, catalog, "m", 0)
        assert {
            t["Config"]["image"] for g in job["TaskGroups"] for t in g["Tasks"] if t["Name"] == "engine"
        } == {image}
        found = [i for i in invocations(job, engine, image) if i.table.program != "ray start"]
        assert release in {i.table.release for i in found}
        assert_known_to_the_engine(found)
    if engine is Engine.VLLM:
        # The two releases launch differently across nodes, and each table says why: 0.11.0
        # has no --nnodes, so the argv rendered for 0.34.0 would not parse there.
        catalog = load_catalog(
            _profile_lines(engine, 2, DEFAULT_IMAGES[engine], Role.CHAT), filename="c", policy=shipped_policy
        ).catalog
        assert catalog is not None
        new_job = _render(shipped_policy, catalog, "m", 0)
        [old_table] = tables_for_image(engine, old_image)
        rendered_for_new = [
            Invocation(i.where, old_table, i.argv)
            for i in invocations(new_job, engine, DEFAULT_IMAGES[engine])
            if i.table.program == "vllm serve"
        ]
        with pytest.raises(AssertionError, match="--nnodes"):
            assert_known_to_the_engine(rendered_for_new)


def test_every_profile_of_the_example_catalog_renders_argv_its_image_knows(
    shipped_policy: SecurityPolicy,
) -> None:
    text = (REPO / "examples" / "catalog.yaml").read_text(encoding="utf-8")
    catalog = load_catalog(text, filename="examples/catalog.yaml", policy=shipped_policy).catalog
    assert catalog is not None
    checked = 0
    for name, model in catalog.models.items():
        for index, profile in enumerate(model.profiles):
            if profile.engine not in PROGRAMS:
                continue
            image = profile.image or DEFAULT_IMAGES[profile.engine]
            assert_known_to_the_engine(
                invocations(_render(shipped_policy, catalog, name, index), profile.engine, image)
            )
            checked += 1
    assert checked >= 5


def test_the_check_catches_a_flag_the_pinned_release_does_not_know(shipped_policy: SecurityPolicy) -> None:
    # A catalog's args are rendered too: a flag missing its value is caught.
    text = _profile_lines(
        Engine.VLLM,
        1,
        DEFAULT_IMAGES[Engine.VLLM],
        Role.CHAT,
        ["--max-model-len", "4096", "--kv-cache-dtype"],
    )
    catalog = load_catalog(text, filename="c", policy=shipped_policy).catalog
    assert catalog is not None
    found = invocations(_render(shipped_policy, catalog, "m", 0), Engine.VLLM, DEFAULT_IMAGES[Engine.VLLM])
    with pytest.raises(AssertionError, match="--kv-cache-dtype takes one value"):
        assert_known_to_the_engine(found)


def _names_the_policy_readme_says_llmgw_sets() -> set[str]:
    text = (REPO / "policies" / "README.md").read_text(encoding="utf-8")
    names: set[str] = set()
    for bullet in re.split(r"\n(?=- )", text):
        said, found, _ = " ".join(bullet.split()).partition("because llmgw sets")
        if found:
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", said))
    return names


def test_what_the_policy_readme_says_llmgw_sets_it_sets(shipped_policy: SecurityPolicy) -> None:
    said = _names_the_policy_readme_says_llmgw_sets()
    assert said, "policies/README.md no longer says which variables llmgw sets"
    for name in sorted(said):
        engines = [e for e in PROGRAMS if name.startswith(f"{e.value.upper()}_")] or list(PROGRAMS)
        for engine in engines:
            text = _profile_lines(engine, 1, DEFAULT_IMAGES[engine], Role.CHAT)
            catalog = load_catalog(text, filename="c", policy=shipped_policy).catalog
            assert catalog is not None
            job = _render(shipped_policy, catalog, "m", 0)
            env = {
                k
                for g in job["TaskGroups"]
                for t in g["Tasks"]
                if t["Name"] == "engine"
                for k in t["Env"] or {}
            }
            assert name in env, (
                f"policies/README.md says llmgw sets {name}, but the {engine} engine has no such env"
            )


# Each engine's switch for usage.prompt_tokens_details.cached_tokens, which vLLM and SGLang
# leave out of their answers without it (llama-server reports it always): the router's
# cached-token metrics and each key's usage read it (llmgw/core/engine_usage.py).
CACHE_REPORT = {Engine.VLLM: "--enable-prompt-tokens-details", Engine.SGLANG: "--enable-cache-report"}


@pytest.mark.parametrize("engine", sorted(CACHE_REPORT, key=str))
@pytest.mark.parametrize("nodes", [1, 2])
def test_the_serving_engine_reports_its_cached_tokens(
    shipped_policy: SecurityPolicy, engine: Engine, nodes: int
) -> None:
    text = _profile_lines(engine, nodes, DEFAULT_IMAGES[engine], Role.CHAT)
    catalog = load_catalog(text, filename="c", policy=shipped_policy).catalog
    assert catalog is not None
    job = _render(shipped_policy, catalog, "m", 0)
    serving = [i for i in invocations(job, engine, DEFAULT_IMAGES[engine]) if "--served-model-name" in i.argv]
    assert serving, job["TaskGroups"]
    for invocation in serving:
        assert CACHE_REPORT[engine] in invocation.argv, invocation.argv
