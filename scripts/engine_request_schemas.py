"""Regenerate llmgw's vendored engine request schemas (llmgw/apispec/engines/requests/).

Each file, ``<engine>-<release>.json``, holds the JSON schemas of the request models
one vLLM or SGLang release validates a body with before it does anything else (its
pydantic classes, dumped with ``TypeAdapter(cls).json_schema()``), the versions of
the packages that shaped them (pydantic, openai: the Responses and chat models are
built from openai-python's types), and every model and field validator of those
classes, by name and source line: pydantic runs them on a request, but JSON schema
cannot carry them, so the tests hold llmgw's own check of each one that matters
beside the schema (``llmgw/apispec/engine_requests.py``).

The script runs inside a scratch virtualenv where the release is importable, and
reads the release's own modules there, never a copy:

    python3 -m venv /tmp/req-vllm-0.34.0
    /tmp/req-vllm-0.34.0/bin/pip install --no-deps vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl \\
        torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /tmp/req-vllm-0.34.0/bin/pip install pydantic openai==3.60.0 <LIGHT_DEPENDENCIES["vllm"]>
    /tmp/req-vllm-0.34.0/bin/python scripts/engine_request_schemas.py vllm 0.34.0

``--no-deps`` keeps out what only serves inference (CUDA kernels, flashinfer,
xgrammar, the torch the wheel pins); ``LIGHT_DEPENDENCIES`` is what importing the
protocol modules really needs (found by importing them until no module was missing).
No module is stubbed:

- vLLM's package ``__init__`` and ``vllm.config`` import torch, so torch is installed
  for real: the CPU build on this machine's disk (2.13.0; 0.34.0 pins 2.14.0, 0.11.0
  pins 2.8.0). No request model has a torch type in it: ``ModelConfig`` and
  ``SamplingParams`` are only used by methods that run after validation.
- openai-python shapes the schemas (vLLM's Responses models are its types, the chat
  message parts its TypedDicts), so its version is the one each release's image
  gets: SGLang pins it exactly (0.5.23: ``openai==2.8.0``, 0.5.3: ``openai==1.99.1``,
  both its wheel's Requires-Dist); vLLM gives a floor (0.34.0: ``>=2.25.0``, 0.11.0:
  ``>=1.99.1``) and its image installs the newest at build time, so 0.34.0 (today's
  release) gets today's 3.60.0 and 0.11.0 its floor, 1.99.1, which SGLang 0.5.3 of
  the same month pinned too.

Which classes (``REQUEST_MODELS``): the ones each release's HTTP server declares as
the body of the route (vLLM: ``vllm/entrypoints/openai/api_server.py`` 0.11.0, the
``api_router.py`` of each entrypoint in 0.34.0; SGLang:
``sglang/srt/entrypoints/http_server.py``). An API missing from a release is left
out of its file (vLLM 0.11.0 has no Anthropic Messages; SGLang 0.5.3 has none
either).

Never run by the tests: they read the vendored files.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE_SCHEMAS = REPO / "llmgw" / "apispec" / "engines" / "requests"
DISTRIBUTIONS = {"vllm": "vllm", "sglang": "sglang"}

# What importing the protocol modules needs beyond pydantic and openai, per engine.
LIGHT_DEPENDENCIES: Mapping[str, tuple[str, ...]] = {
    "vllm": (
        "numpy",
        "packaging",
        "regex",
        "pyyaml",
        "psutil",
        "py-cpuinfo",
        "pyzmq",
        "urllib3",
        "requests",
        "transformers",
        "aiohttp",
        "fastapi",
        "pillow",
        "pybase64",
        "cachetools",
        "prometheus_client",
        "openai-harmony",
        "cbor2",
        "msgspec",
        "cloudpickle",
        "uvloop",
        "sympy",
        "networkx",
        "jinja2",
        "fsspec",
        "filelock",
        "typing_extensions",
    ),
    "sglang": ("msgspec", "numpy", "pybase64", "IPython", "aiohttp", "requests", "packaging"),
}

# engine -> API -> the classes that may hold it, newest layout first: "module:attribute".
REQUEST_MODELS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "vllm": {
        "chat_completions": (
            "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
            "vllm.entrypoints.openai.protocol:ChatCompletionRequest",
        ),
        "completions": (
            "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
            "vllm.entrypoints.openai.protocol:CompletionRequest",
        ),
        "embeddings": (
            "vllm.entrypoints.pooling.embed.protocol:EmbeddingRequest",
            "vllm.entrypoints.openai.protocol:EmbeddingRequest",
        ),
        "responses": (
            "vllm.entrypoints.openai.responses.protocol:ResponsesRequest",
            "vllm.entrypoints.openai.protocol:ResponsesRequest",
        ),
        "messages": ("vllm.entrypoints.anthropic.protocol:AnthropicMessagesRequest",),
    },
    "sglang": {
        "chat_completions": ("sglang.srt.entrypoints.openai.protocol:ChatCompletionRequest",),
        "completions": ("sglang.srt.entrypoints.openai.protocol:CompletionRequest",),
        "embeddings": ("sglang.srt.entrypoints.openai.protocol:EmbeddingRequest",),
        "responses": ("sglang.srt.entrypoints.openai.protocol:ResponsesRequest",),
        "messages": ("sglang.srt.entrypoints.anthropic.protocol:AnthropicMessagesRequest",),
    },
}


def _resolve(candidates: tuple[str, ...]) -> tuple[str, Any] | None:
    for candidate in candidates:
        module_name, attribute = candidate.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
                continue  # this release lays its modules out otherwise
            raise  # a dependency missing: the scratch venv is incomplete, say so
        if hasattr(module, attribute):
            return candidate, getattr(module, attribute)
    return None


def _models_in(target: Any) -> list[type]:
    """The pydantic classes ``target`` (a class or an Annotated union) validates with."""
    from pydantic import BaseModel

    found: list[type] = []

    def walk(value: Any) -> None:
        if isinstance(value, type) and issubclass(value, BaseModel):
            if value not in found:
                found.append(value)
            return
        for argument in getattr(value, "__args__", ()) or ():
            walk(argument)
        origin = getattr(value, "__origin__", None)
        if origin is not None and origin is not value:
            walk(origin)

    walk(target)
    return found


def _validators(target: Any) -> list[dict[str, str]]:
    """Every model and field validator of ``target``'s classes, with where it is."""
    rows: list[dict[str, str]] = []
    for model in _models_in(target):
        decorators = model.__pydantic_decorators__
        for kind, table in (("model", decorators.model_validators), ("field", decorators.field_validators)):
            for name, decorator in sorted(table.items()):
                function = decorator.func
                function = getattr(function, "__func__", function)
                try:
                    source = inspect.getsourcefile(function) or "?"
                    line = inspect.getsourcelines(function)[1]
                except (OSError, TypeError):
                    source, line = "?", 0
                where = source.split("site-packages/", 1)[-1]
                fields = getattr(decorator.info, "fields", ())
                rows.append(
                    {
                        "class": model.__name__,
                        "kind": kind,
                        "name": name,
                        "mode": str(getattr(decorator.info, "mode", "")),
                        "fields": ",".join(fields),
                        "where": f"{where}:{line}",
                    }
                )
    return rows


def extract(engine: str, release: str) -> dict[str, Any]:
    from pydantic import TypeAdapter

    installed = importlib.metadata.version(DISTRIBUTIONS[engine])
    if installed != release:
        raise SystemExit(
            f"{engine} {installed} is installed here, not {release}: run this in its scratch venv"
        )
    apis: dict[str, Any] = {}
    for api, candidates in REQUEST_MODELS[engine].items():
        resolved = _resolve(candidates)
        if resolved is None:
            continue
        where, target = resolved
        apis[api] = {
            "class": where,
            "extra": _extra(target),
            "schema": TypeAdapter(target).json_schema(mode="validation"),
            "validators": _validators(target),
        }
    return {
        "engine": engine,
        "release": release,
        "packages": {name: importlib.metadata.version(name) for name in ("pydantic", "openai")},
        "apis": apis,
    }


def _extra(target: Any) -> str:
    """What the classes do with a field they do not declare ("allow", "ignore", "forbid")."""
    settings = {str(model.model_config.get("extra") or "ignore") for model in _models_in(target)}
    return ",".join(sorted(settings))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=sorted(REQUEST_MODELS))
    parser.add_argument("release")
    parser.add_argument("--out", type=Path, default=PACKAGE_SCHEMAS)
    args = parser.parse_args(argv)
    document = extract(args.engine, args.release)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.engine}-{args.release}.json"
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"{path}: {', '.join(document['apis'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
