#!/usr/bin/env python3
"""Regenerates llmgw/apispec/engines/engine-parsers.json: the tool-call parsers and reasoning
parsers each vLLM and SGLang release registers, read from the release's own wheel.

Never run by the tests. The wheels are read as zip files and their Python source with
``ast`` (importing them needs torch and a GPU stack): what counts is the registry the
server's flag is checked against, in the release's own words.

- vLLM: ``ToolParserManager``/``ReasoningParserManager``: every
  ``@Manager.register_module("name")`` (a name or a list of names; 0.11.0's form), every
  ``Manager.register_lazy_module(name=...)``, and the keys of the lazy tables
  ``_TOOL_PARSERS_TO_REGISTER`` / ``_REASONING_PARSERS_TO_REGISTER`` (0.34.0's form,
  ``vllm/tool_parsers/__init__.py``, ``vllm/reasoning/__init__.py``).
  ``--tool-call-parser`` takes a registered name (``ToolParserManager.get_tool_parser``);
  ``--reasoning-parser`` too.
- SGLang: the keys of ``FunctionCallParser.ToolCallParserEnum``
  (``sglang/srt/function_call/function_call_parser.py``) and of
  ``ReasoningParser.DetectorMap`` (``sglang/srt/parser/reasoning_parser.py``), which are
  ``--tool-call-parser``'s and ``--reasoning-parser``'s ``choices`` in ``server_args.py``.

Usage (a release at a time; the file keeps the others):

    python scripts/engine_parser_tables.py vllm 0.34.0 /work/wheels/vllm-0.34.0-*.whl
    python scripts/engine_parser_tables.py sglang 0.5.23 /work/wheels/sglang-0.5.23-*.whl
    pip download --no-deps -d /tmp/w vllm==0.11.0
    python scripts/engine_parser_tables.py vllm 0.11.0 /tmp/w/vllm-0.11.0-*.whl

The release key is the one ``llmgw.core.catalog.images.tag_release`` reads from an image
tag (``v0.34.0`` and ``v0.5.23-cu129`` are 0.34.0 and 0.5.23).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "llmgw" / "apispec" / "engines" / "engine-parsers.json"

_VLLM_MANAGERS = {"ToolParserManager": "tool_call_parsers", "ReasoningParserManager": "reasoning_parsers"}
_VLLM_TABLES = {
    "_TOOL_PARSERS_TO_REGISTER": "tool_call_parsers",
    "_REASONING_PARSERS_TO_REGISTER": "reasoning_parsers",
}
_SGLANG_REGISTRIES = {
    ("sglang/srt/function_call/function_call_parser.py", "ToolCallParserEnum"): "tool_call_parsers",
    ("sglang/srt/parser/reasoning_parser.py", "DetectorMap"): "reasoning_parsers",
}


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _dict_keys(node: ast.expr | None) -> list[str]:
    if not isinstance(node, ast.Dict):
        return []
    return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]


def _vllm(wheel: zipfile.ZipFile) -> tuple[dict[str, set[str]], list[str]]:
    found: dict[str, set[str]] = {"tool_call_parsers": set(), "reasoning_parsers": set()}
    files: set[str] = set()
    for name in wheel.namelist():
        if not (name.startswith("vllm/") and name.endswith(".py")):
            continue
        text = wheel.read(name).decode("utf-8")
        if not any(word in text for word in (*_VLLM_MANAGERS, *_VLLM_TABLES)):
            continue
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in _VLLM_TABLES and _dict_keys(node.value):
                        found[_VLLM_TABLES[target.id]].update(_dict_keys(node.value))
                        files.add(name)
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            kind = _VLLM_MANAGERS.get(owner.id) if isinstance(owner, ast.Name) else None
            if kind is None or node.func.attr not in ("register_module", "register_lazy_module"):
                continue
            names = [s for arg in node.args[:1] for s in _strings(arg)]
            names += [s for kw in node.keywords if kw.arg in ("name", "names") for s in _strings(kw.value)]
            if names:
                found[kind].update(names)
                files.add(name)
    return found, sorted(files)


def _sglang(wheel: zipfile.ZipFile) -> tuple[dict[str, set[str]], list[str]]:
    found: dict[str, set[str]] = {"tool_call_parsers": set(), "reasoning_parsers": set()}
    for (path, attribute), kind in _SGLANG_REGISTRIES.items():
        tree = ast.parse(wheel.read(path).decode("utf-8"), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign | ast.Assign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == attribute for t in targets):
                    found[kind].update(_dict_keys(node.value))
        if not found[kind]:
            raise SystemExit(f"{path}: no {attribute} dict literal; read the release and update this script")
    return found, sorted(path for path, _ in _SGLANG_REGISTRIES)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("engine", choices=["vllm", "sglang"])
    parser.add_argument("release", help="as tag_release reads it: 0.34.0, 0.5.23")
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    with zipfile.ZipFile(args.wheel) as wheel:
        found, files = (_vllm if args.engine == "vllm" else _sglang)(wheel)
    for kind, names in found.items():
        if not names:
            raise SystemExit(f"{args.wheel.name}: found no {kind}; read the release and update this script")
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    data["generated_by"] = "scripts/engine_parser_tables.py (from each release's own wheel; do not edit)"
    releases = data.setdefault("engines", {}).setdefault(args.engine, {})
    releases[args.release] = {
        "read_from": f"{args.wheel.name}: {', '.join(files)}",
        "tool_call_parsers": sorted(found["tool_call_parsers"]),
        "reasoning_parsers": sorted(found["reasoning_parsers"]),
    }
    data["engines"][args.engine] = dict(sorted(releases.items(), key=lambda item: _release_key(item[0])))
    data["engines"] = dict(sorted(data["engines"].items()))
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(
        f"{args.engine} {args.release}: {len(found['tool_call_parsers'])} tool-call parsers, "
        f"{len(found['reasoning_parsers'])} reasoning parsers -> {args.out}",
        file=sys.stderr,
    )
    return 0


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split(".") if part.isdigit())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
