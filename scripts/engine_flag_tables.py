"""Regenerate llmgw's vendored engine flag tables (llmgw/apispec/engines/*-flags.json).

The tables say, for each engine release an image pins, every flag its server
parses: names, aliases, negations, arity, and a risk class (reads or writes a
path, loads code, runs remote code, opens or connects to an address). Names and
arity come from the release itself; risk classes are a review, carried over by
flag name from the table being replaced, and a flag nobody has reviewed yet is
written with ``"risks": null`` so the table tests fail until someone does.

Sources, one subcommand each (none of them runs in the tests):

  from-shared DIR       the project's audit tables (../shared/engines/*-flags.json),
                        themselves read from each release's own parser
  from-vllm RELEASE     vllm installed in this interpreter (pip install vllm==RELEASE):
                        make_arg_parser(FlexibleArgumentParser()), every action
  from-sglang RELEASE   sglang installed in this interpreter: ServerArgs.add_cli_args
                        on a plain argparse.ArgumentParser, every action
  from-llamacpp COMMIT ARG_CPP
                        llama.cpp's common/arg.cpp at COMMIT (a commit, or a release tag
                        such as b11434 where the source is an sdist without git): every
                        add_opt(common_arg(...)) registered for the server (or common)
                        examples, with its .set_env

Reading a release's parser without a GPU: both engines' parsers are built by
importing the server's modules, which import the whole engine. The releases are read
in a scratch venv holding the release's wheel installed ``--no-deps``, torch's CPU
wheel (``torch==X+cpu``), transformers and the small pure-Python packages the
imports fail without (pip says which, one at a time); ``--stub-modules`` names the
remaining heavy or GPU-only top-level packages (vLLM 0.34.0: openai_harmony,
xgrammar, llguidance, cv2, torchaudio, opentelemetry, prometheus_client; SGLang
0.5.23: mistral_common, sentencepiece, torchvision, torchaudio), which are then
imported as inert stand-ins: any attribute is a class that does nothing, so a module
may import and subclass their names at import time. No parser option comes from
them: the options are ``add_argument`` calls in the engines' own modules (vLLM's
config dataclasses and ``FrontendArgs``, SGLang's ``ServerArgs.add_cli_args``), read
whole. vLLM also needs ``VLLM_TARGET_DEVICE=cpu`` (its default ``DeviceConfig``
infers a device when the parser is built; the device changes defaults, not options).

``--out`` is the folder written (default: the package's). ``tables_from_shared`` is
what the drift test compares the vendored files with.

Where the audit tables and the engines' source disagree, the source wins:
``SOURCE_CORRECTIONS`` holds each correction with the file and line it follows, and
every subcommand applies it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE_TABLES = REPO / "llmgw" / "apispec" / "engines"
ENGINES = ("vllm", "sglang", "llamacpp")
RISKS = ("reads_path", "writes_path", "loads_code", "remote_code", "network", "downloads_model")
PROGRAMS = {
    "vllm": "vllm serve",
    "sglang": "python3 -m sglang.launch_server",
    "llamacpp": "llama-server",
}

# engine -> flag -> (fields the engine's source gives it, where the source says so).
SOURCE_CORRECTIONS: Mapping[str, Mapping[str, tuple[Mapping[str, Any], str]]] = {
    "vllm": {
        "--allowed-origins": (
            {"risks": []},
            "vllm/entrypoints/openai/api_server.py (0.10.2, 0.11.0): the origins only feed Starlette's "
            "CORSMiddleware(allow_origins=...); nothing is bound, connected or read",
        ),
        "--enable-log-requests": (
            {"risks": ["writes_path"]},
            "vllm/entrypoints/logger.py: RequestLogger writes prompts to the process log; no socket",
        ),
    },
    "sglang": {},
    "llamacpp": {
        "--swa-checkpoints": (
            {"nargs": 1},
            'common/arg.cpp:1511 at 4227c9be: {"--swa-checkpoints"}, "N", ... [](common_params &, int value)',
        ),
        "--cache-reuse": (
            {"nargs": 1},
            'common/arg.cpp:2932 at 4227c9be: {"--cache-reuse"}, "N", ... [](common_params &, int value)',
        ),
        "--cache-ram": (
            {"nargs": 1},
            'common/arg.cpp:1302 at 49bfddec: {"-cram", "--cache-ram"}, "N", ... (an int)',
        ),
        "--adaptive-target": (
            {"nargs": 1},
            'common/arg.cpp:1751 at 49bfddec: {"--adaptive-target"}, "N", ... (a float)',
        ),
    },
}


def _risks_of_audit_entry(entry: Mapping[str, Any]) -> list[str]:
    risks = [risk for risk in RISKS[:5] if entry.get(risk)]
    if entry.get("preset_downloads_model"):
        risks.append("downloads_model")
    return risks


def _flag(
    flag: str,
    aliases: Iterable[str],
    negations: Iterable[str],
    nargs: int | str,
    risks: list[str] | None,
    env: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"flag": flag, "aliases": sorted(set(aliases))}
    if negations:
        out["negations"] = sorted(set(negations))
    out["nargs"] = nargs
    out["risks"] = risks
    if env:
        out["env"] = env
    return out


def _correct(engine: str, flags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    corrections = SOURCE_CORRECTIONS[engine]
    for entry in flags:
        if entry["flag"] in corrections:
            entry.update(corrections[entry["flag"]][0])
    return sorted(flags, key=lambda entry: str(entry["flag"]))


def _release(
    engine: str,
    source: str,
    image_tags: Sequence[str],
    parser: Mapping[str, Any],
    flags: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "source": source,
        "image_tags": list(image_tags),
        "parser": {
            key: parser[key]
            for key in ("allow_abbrev", "underscores_as_dashes", "equals_form", "dotted_json_keys")
        }
        | {"max_positionals": parser["max_positionals"], "values_are_next_words": _next_word_values(parser)},
        "program": PROGRAMS[engine],
        "flags": _correct(engine, flags),
    }


def _next_word_values(parser: Mapping[str, Any]) -> bool:
    """llama.cpp's table lookup takes the next word as the value, whatever it looks like
    (common_params_parse_ex: ``if (++i >= argc) throw``); argparse does not."""
    if "values_are_next_words" in parser:
        return bool(parser["values_are_next_words"])
    return str(parser.get("kind", "")).startswith("exact table lookup")


def _flags_of_audit(engine: str, entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    negation_of = {e["flag"]: e["negates"] for e in entries if e.get("negates")}
    flags = []
    for entry in entries:
        if entry["flag"] in negation_of:
            continue  # llama.cpp lists a negation as its own entry; it belongs to its flag
        negations = set(entry.get("negated_by") or ())
        aliases = [a for a in entry["aliases"] if a not in negations]
        flags.append(
            _flag(
                entry["flag"],
                aliases,
                negations,
                entry["nargs"],
                _risks_of_audit_entry(entry),
                entry.get("env"),
            )
        )
        for negation in sorted(negations):
            negation_entry = next((e for e in entries if e["flag"] == negation), None)
            if negation_entry is not None and negation_entry.get("env"):
                flags[-1].setdefault("negation_env", {})[negation] = negation_entry["env"]
    return flags


# Image tags the audit in ../shared does not name, between the same two commits it read.
# llama.cpp's image build numbers count commits (``b<git rev-list --count HEAD>``,
# .github/workflows/docker.yml): b6795 (October 2025, the default image llmgw renders, see
# llmgw/render/DESIGN.md) lies after 4227c9be (August 2025, llama-cpp-python 0.3.16) and
# before 49bfddec (2026, llama-cpp-python 0.3.17), as b6700 does.
EXTRA_IMAGE_TAG_BRACKETS: dict[str, dict[str, list[str]]] = {
    "llamacpp": {"server-cuda-b6795": ["4227c9be", "49bfddec"]},
}


def tables_from_shared(shared_engines: Path) -> dict[str, dict[str, Any]]:
    """The vendored tables, built from ../shared/engines (engine -> JSON document)."""
    out: dict[str, dict[str, Any]] = {}
    for engine in ENGINES:
        audit = json.loads((shared_engines / f"{engine}-flags.json").read_text(encoding="utf-8"))
        releases = {}
        for name, release in audit["versions"].items():
            [(_, entries)] = release["programs"].items()
            releases[name] = _release(
                engine,
                release["source"],
                release["image_tags"],
                release["parser"],
                _flags_of_audit(engine, entries),
            )
        document: dict[str, Any] = {
            "engine": engine,
            "generated_by": "scripts/engine_flag_tables.py",
            "how_read": audit["how_read"],
            "releases": releases,
        }
        brackets = {**audit.get("image_tag_brackets", {}), **EXTRA_IMAGE_TAG_BRACKETS.get(engine, {})}
        if brackets:
            # A tag between two known commits: a flag is known only if both have it.
            document["image_tag_brackets"] = brackets
        if "ray_start" in audit:
            ray = audit["ray_start"]
            document["ray_start"] = {
                "source": ray["source"],
                "program": "ray start",
                "flags": sorted(
                    (
                        _flag(e["flag"], e["aliases"], (), e["nargs"], _risks_of_audit_entry(e))
                        for e in ray["flags"]
                    ),
                    key=lambda entry: str(entry["flag"]),
                ),
            }
        out[engine] = document
    return out


def render(document: Mapping[str, Any]) -> str:
    """The file text of one table: stable (sorted flags, one flag a line, final newline)."""
    lines: dict[str, str] = {}

    def placeholders(value: Any) -> Any:
        # One flag a line, so a diff between releases reads as a list of flags.
        if isinstance(value, dict) and "flag" in value:
            key = f"@flag{len(lines)}@"
            lines[key] = json.dumps(value, ensure_ascii=False)
            return key
        if isinstance(value, dict):
            return {k: placeholders(v) for k, v in value.items()}
        if isinstance(value, list):
            return [placeholders(v) for v in value]
        return value

    text = json.dumps(placeholders(document), indent=1, ensure_ascii=False)
    return re.sub(r'"(@flag\d+@)"', lambda match: lines[match.group(1)], text) + "\n"


def _reviewed_risks(out: Path, engine: str) -> dict[str, list[str] | None]:
    """Risk classes already reviewed, by flag name, from the table being replaced."""
    path = out / f"{engine}-flags.json"
    if not path.exists():
        return {}
    reviewed: dict[str, list[str] | None] = {}
    for release in json.loads(path.read_text(encoding="utf-8"))["releases"].values():
        for entry in release["flags"]:
            # By every spelling: a release may list the same option under another first name.
            for name in (entry["flag"], *entry["aliases"]):
                reviewed.setdefault(name, entry["risks"])
    return reviewed


def _flags_of_argparse(parser: argparse.ArgumentParser, reviewed: Mapping[str, Any]) -> list[dict[str, Any]]:
    flags = []

    def review_of(names: Sequence[str]) -> list[str] | None:
        return next((reviewed[name] for name in names if reviewed.get(name) is not None), None)

    # Every spelling the parser takes, also those an action hides from --help (vLLM 0.34's
    # EnableDisableAction keeps --no-enable-x registered but out of option_strings).
    registered: dict[int, list[str]] = {}
    for option, registered_action in parser._option_string_actions.items():
        registered.setdefault(id(registered_action), []).append(option)
    for action in parser._actions:
        if not action.option_strings:
            continue
        spellings = list(dict.fromkeys([*action.option_strings, *registered.get(id(action), [])]))
        longs = [o for o in spellings if o.startswith("--")]
        shorts = [o for o in spellings if not o.startswith("--")]
        # vLLM 0.34's EnableDisableAction pairs --enable-x with --disable-x and says which
        # spellings negate (negative_option_strings); argparse's own negates with --no-.
        negative = getattr(action, "negative_option_strings", None)
        negations = [
            o
            for o in longs
            if (o in negative if negative is not None else o.startswith("--no-"))
            and isinstance(action, argparse.BooleanOptionalAction)
        ]
        names = [o for o in longs if o not in negations] or shorts
        flag = names[0]
        nargs: int | str
        if action.nargs is None:
            nargs = 0 if action.const is not None or isinstance(action, _NO_VALUE_ACTIONS) else 1
        elif isinstance(action.nargs, int):
            nargs = action.nargs
        else:
            nargs = str(action.nargs)
        if isinstance(action, _NO_VALUE_ACTIONS):
            nargs = 0
        aliases = [o for o in spellings if o != flag and o not in negations]
        flags.append(_flag(flag, aliases, negations, nargs, review_of([flag, *aliases])))
    return flags


_NO_VALUE_ACTIONS = (
    argparse._StoreConstAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._CountAction,
    argparse._HelpAction,
    argparse._VersionAction,
    argparse.BooleanOptionalAction,
)


def _merge_release(out: Path, engine: str, name: str, release: dict[str, Any]) -> None:
    path = out / f"{engine}-flags.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    document["releases"][name] = release
    path.write_text(render(document), encoding="utf-8")


def install_module_stand_ins(packages: Iterable[str]) -> None:
    """Import each of ``packages`` (top-level names) as an inert stand-in when it is not
    installed: every attribute is a class that takes any arguments and does nothing."""
    import importlib.abc
    import importlib.machinery
    import types

    stand_in_packages = frozenset(packages)

    def any_schema(cls: type, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()  # a pydantic model may name a stand-in as a field type

    class StandIn(type):
        def __getattr__(cls, name: str) -> Any:
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            return stand_in(f"{cls.__name__}.{name}")

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            return cls

        def __getitem__(cls, item: Any) -> Any:
            return cls

        def __or__(cls, other: Any) -> Any:
            return cls

        def __ror__(cls, other: Any) -> Any:
            return cls

        def __iter__(cls) -> Any:
            return iter(())

        def __bool__(cls) -> bool:
            return False

        def __mro_entries__(cls, bases: Any) -> tuple[type, ...]:
            return (object,)

    def stand_in(name: str) -> type:
        return StandIn(name, (), {"__get_pydantic_core_schema__": classmethod(any_schema)})

    class StandInModule(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            full = f"{self.__name__}.{name}"
            value = sys.modules.get(full) or stand_in(full)
            setattr(self, name, value)
            return value

    class Loader(importlib.abc.Loader):
        def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
            module = StandInModule(spec.name)
            module.__path__ = []
            module.__version__ = "0.0.0"  # type: ignore[attr-defined]
            return module

        def exec_module(self, module: types.ModuleType) -> None:
            pass

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname.split(".")[0] not in stand_in_packages:
                return None
            return importlib.machinery.ModuleSpec(fullname, Loader(), is_package=True)

    # Last: an installed package is always imported for real.
    sys.meta_path.append(Finder())


def from_vllm(out: Path, release_name: str, image_tags: Sequence[str]) -> None:
    import vllm  # type: ignore[import-not-found]

    try:  # 0.34 moved the server's parser and the parser class
        from vllm.entrypoints.common.cli_args import make_arg_parser  # type: ignore[import-not-found]
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]
    except ImportError:  # 0.10, 0.11
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[import-not-found]
        from vllm.utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    if vllm.__version__ != release_name:
        sys.exit(f"vllm {vllm.__version__} is installed, not {release_name}")
    parser = make_arg_parser(FlexibleArgumentParser())
    parser_facts = {
        "allow_abbrev": parser.allow_abbrev,
        # FlexibleArgumentParser.parse_args rewrites --a_b before the first '.'
        "underscores_as_dashes": True,
        "equals_form": True,
        "dotted_json_keys": True,
        "max_positionals": 1,  # model_tag
        "values_are_next_words": False,
    }
    flags = _flags_of_argparse(parser, _reviewed_risks(out, "vllm"))
    source = f"PyPI wheel vllm=={release_name}, make_arg_parser(FlexibleArgumentParser())"
    _merge_release(out, "vllm", release_name, _release("vllm", source, image_tags, parser_facts, flags))


def from_sglang(out: Path, release_name: str, image_tags: Sequence[str]) -> None:
    import sglang  # type: ignore[import-not-found]
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    if sglang.__version__ != release_name:
        sys.exit(f"sglang {sglang.__version__} is installed, not {release_name}")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser_facts = {
        "allow_abbrev": parser.allow_abbrev,
        "underscores_as_dashes": False,
        "equals_form": True,
        "dotted_json_keys": False,
        "max_positionals": 0,
        "values_are_next_words": False,
    }
    flags = _flags_of_argparse(parser, _reviewed_risks(out, "sglang"))
    source = f"PyPI sglang=={release_name}, ServerArgs.add_cli_args(argparse.ArgumentParser())"
    _merge_release(out, "sglang", release_name, _release("sglang", source, image_tags, parser_facts, flags))


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _balanced(text: str, start: int) -> int:
    """The index just past the bracket that closes the one at ``start`` (strings skipped)."""
    depth, index, opening = 0, start, "([{"
    while index < len(text):
        char = text[index]
        if char == '"':
            index = _STRING.match(text, index).end()  # type: ignore[union-attr]
            continue
        if char == "'":
            index = text.index("'", index + 2) + 1 if text[index + 1] == "\\" else index + 3
            continue
        if char in opening:
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    raise ValueError(f"unbalanced bracket at offset {start}")


def _top_level_arguments(text: str) -> list[str]:
    """``text`` (what is between a call's parentheses) split at its top-level commas."""
    parts, depth, current, index = [], 0, [], 0
    while index < len(text):
        char = text[index]
        if char == '"':
            end = _STRING.match(text, index).end()  # type: ignore[union-attr]
            current.append(text[index:end])
            index = end
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
        index += 1
    parts.append("".join(current).strip())
    return parts


def _without_comments(source: str) -> str:
    """C++ source with its // and /* */ comments blanked (string literals kept whole)."""
    out, index = [], 0
    while index < len(source):
        if source[index] == '"':
            end = _STRING.match(source, index).end()  # type: ignore[union-attr]
            out.append(source[index:end])
            index = end
        elif source.startswith("//", index):
            index = source.find("\n", index)
            index = len(source) if index < 0 else index
        elif source.startswith("/*", index):
            index = source.index("*/", index) + 2
        elif source[index] == "'":
            end = source.index("'", index + 2) + 1 if source[index + 1] == "\\" else index + 3
            out.append(source[index:end])
            index = end
        else:
            out.append(source[index])
            index += 1
    return "".join(out)


def llamacpp_options(arg_cpp: str) -> list[dict[str, Any]]:
    """Every server option of common/arg.cpp: ``add_opt(common_arg(NAMES, [NEGATIONS],
    [VALUE_HINT, [VALUE_HINT_2]], HELP, HANDLER)[.set_examples(...)][.set_env("...")])``.
    The number of value hints is the option's arity (common_arg's constructors)."""
    arg_cpp = _without_comments(arg_cpp)
    options = []
    for match in re.finditer(r"add_opt\(common_arg\(", arg_cpp):
        call_end = _balanced(arg_cpp, match.end() - 1)
        arguments = _top_level_arguments(arg_cpp[match.end() : call_end - 1])
        names = _STRING.findall(arguments[0])
        negations = _STRING.findall(arguments[1]) if arguments[1].startswith("{") else []
        hints = len(arguments) - 3 - (1 if negations else 0)
        chain_end = _balanced(arg_cpp, match.start() + len("add_opt"))
        chain = arg_cpp[call_end:chain_end]
        examples = re.search(r"\.set_examples\(\{([^}]*)\}\)", chain)
        if examples and not re.search(r"LLAMA_EXAMPLE_(SERVER|COMMON)\b", examples.group(1)):
            continue
        # common_params_parser_init: (in_example(ex) || in_example(COMMON)) && !is_exclude(ex)
        excludes = re.search(r"\.set_excludes\(\{([^}]*)\}\)", chain)
        if excludes and re.search(r"LLAMA_EXAMPLE_SERVER\b", excludes.group(1)):
            continue
        env = re.search(r'\.set_env\("([^"]+)"\)', chain)
        longs = [n for n in names if n.startswith("--")]
        flag = longs[0] if longs else names[0]
        options.append(
            {
                "flag": flag,
                "aliases": [n for n in names if n != flag],
                "negations": negations,
                "nargs": hints,
                "env": env.group(1) if env else None,
            }
        )
    return options


def from_llamacpp(out: Path, commit: str, arg_cpp: Path, image_tags: Sequence[str]) -> None:
    reviewed = _reviewed_risks(out, "llamacpp")
    flags = []
    for option in llamacpp_options(arg_cpp.read_text(encoding="utf-8")):
        entry = _flag(
            option["flag"],
            option["aliases"],
            option["negations"],
            option["nargs"],
            next(
                (reviewed[n] for n in (option["flag"], *option["aliases"]) if reviewed.get(n) is not None),
                None,
            ),
            option["env"],
        )
        if option["env"] and option["negations"]:
            # common_arg::get_value_from_env reads LLAMA_ARG_NO_<X> for the negated form.
            negated_env = option["env"].replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)
            entry["negation_env"] = {negation: negated_env for negation in option["negations"]}
        flags.append(entry)
    parser_facts = {
        "allow_abbrev": False,
        "underscores_as_dashes": True,  # common_params_parse_ex: '_' -> '-' for "--" arguments
        "equals_form": False,
        "dotted_json_keys": False,
        "max_positionals": 0,
        "values_are_next_words": True,
    }
    source = f"llama.cpp {'tag' if re.fullmatch(r'b[0-9]+', commit) else 'commit'} {commit}, common/arg.cpp"
    _merge_release(out, "llamacpp", commit[:8], _release("llamacpp", source, image_tags, parser_facts, flags))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=PACKAGE_TABLES, help="folder the tables are written to")
    parser.add_argument(
        "--stub-modules",
        default="",
        help="comma-separated top-level packages to import as inert stand-ins when not installed "
        "(see the module's docstring)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    shared = commands.add_parser("from-shared", help="rebuild every table from ../shared/engines")
    shared.add_argument("shared_engines", type=Path, nargs="?", default=REPO.parent / "shared" / "engines")
    for engine in ("vllm", "sglang"):
        sub = commands.add_parser(
            f"from-{engine}", help=f"add or replace a release from the installed {engine}"
        )
        sub.add_argument("release")
        sub.add_argument(
            "--image-tag", action="append", default=[], help="image tag that carries the release"
        )
    llama = commands.add_parser("from-llamacpp", help="add or replace a release from common/arg.cpp")
    llama.add_argument("commit")
    llama.add_argument("arg_cpp", type=Path)
    llama.add_argument("--image-tag", action="append", default=[])
    args = parser.parse_args(argv)
    install_module_stand_ins(name for name in args.stub_modules.split(",") if name)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "from-shared":
        for engine, document in tables_from_shared(args.shared_engines).items():
            (args.out / f"{engine}-flags.json").write_text(render(document), encoding="utf-8")
    elif args.command == "from-vllm":
        from_vllm(args.out, args.release, args.image_tag)
    elif args.command == "from-sglang":
        from_sglang(args.out, args.release, args.image_tag)
    else:
        from_llamacpp(args.out, args.commit, args.arg_cpp, args.image_tag)
    unreviewed = [
        f"{engine} {name} {entry['flag']}"
        for engine in ENGINES
        if (args.out / f"{engine}-flags.json").exists()
        for name, release in json.loads((args.out / f"{engine}-flags.json").read_text())["releases"].items()
        for entry in release["flags"]
        if entry["risks"] is None
    ]
    if unreviewed:
        print(
            "flags to review (set their risks in the table):\n  " + "\n  ".join(unreviewed), file=sys.stderr
        )


if __name__ == "__main__":
    main()
