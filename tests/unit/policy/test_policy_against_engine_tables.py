"""The shipped policy against the flag tables of the engine releases llmgw's images pin.

Every flag a pinned release parses that reads or writes a path, loads code, runs remote
code, opens an address or downloads another model must be refused (or allowed only with
reviewed values); every llama.cpp variable must be judged as the flag it stands for;
refusals only advise flags the pinned releases have.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator

import pytest

from llmgw.apispec.engine_flags import ProgramTable, release_tables
from llmgw.core.catalog import Engine, SecurityPolicy
from llmgw.core.catalog.security import check_args, check_env

REAL_ENGINES = (Engine.VLLM, Engine.SGLANG, Engine.LLAMACPP)


def _risky_names() -> Iterator[tuple[Engine, str, str]]:
    for engine in REAL_ENGINES:
        for table in release_tables(engine).values():
            for spec in table.flags:
                if spec.risks:
                    for name in spec.names:
                        yield engine, table.release, name


RISKY = sorted(set(_risky_names()))


@pytest.mark.parametrize(("engine", "release", "name"), RISKY, ids=[f"{e}-{r}-{n}" for e, r, n in RISKY])
def test_every_flag_that_reads_loads_or_connects_is_refused(
    shipped_policy: SecurityPolicy, engine: Engine, release: str, name: str
) -> None:
    # A value rule admits reviewed values only, never a path.
    assert check_args(shipped_policy, engine, [name, "/etc/passwd"]), (
        f"{engine} {release} parses {name}, which the tables class as risky: refuse it in "
        "policies/engine-security.yaml (deny, owned, or values)"
    )


def test_the_risk_check_sees_the_gaps_the_audit_found() -> None:
    names = {(engine, name) for engine, _, name in RISKY}
    for gap in (
        (Engine.SGLANG, "--oltp-traces-endpoint"),
        (Engine.SGLANG, "--ds-channel-config-path"),
        (Engine.SGLANG, "--debug-tensor-dump-inject"),
        (Engine.LLAMACPP, "--embd-bge-small-en-default"),
        (Engine.VLLM, "--api-server-count"),
        (Engine.VLLM, "-asc"),
    ):
        assert gap in names


def _llama_variables() -> Iterator[tuple[str, str, tuple[str, ...]]]:
    for table in release_tables(Engine.LLAMACPP).values():
        for spec in table.flags:
            if spec.env:
                yield table.release, spec.env, spec.names
            for negation, env in spec.negation_env:
                yield table.release, env, (negation, *spec.negations)


@pytest.mark.parametrize(("release", "variable", "names"), sorted(set(_llama_variables())))
def test_every_llama_cpp_variable_is_judged_as_its_flag(
    shipped_policy: SecurityPolicy, release: str, variable: str, names: tuple[str, ...]
) -> None:
    if variable in shipped_policy.env.deny_names:
        return  # HF_TOKEN: refused by name, whatever llama.cpp reads it as
    mapped = shipped_policy.env.llamacpp_arg_env.get(variable)
    assert mapped is not None, (
        f"llama.cpp {release} reads {variable} as {names[0]}: add it to llamacpp_arg_env"
    )
    assert mapped in names, f"llama.cpp {release} reads {variable} as {names[0]}, not {mapped}"


_ADVICE = re.compile(r"\b(?:use|pass|set)\s+((?:--?[a-z][a-z0-9-]*(?:\s*,\s*|\s+or\s+|\s+and\s+)?)+)")


def _advised_flags(reason: str) -> list[str]:
    return [
        flag
        for match in _ADVICE.finditer(reason)
        for flag in re.findall(r"--?[a-z][a-z0-9-]*", match.group(1))
    ]


def test_advice_is_read_from_refusals() -> None:
    assert _advised_flags("JSON (JUDGEMENT; use --a-b, --c or -d)") == ["--a-b", "--c", "-d"]
    assert _advised_flags("shows prompts; pass --no-slots (JUDGEMENT)") == ["--no-slots"]


def _knows(table: ProgramTable, flag: str) -> bool:
    return table.lookup(flag) is not None


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_refusals_only_advise_flags_every_pinned_release_has(
    shipped_policy: SecurityPolicy, engine: Engine
) -> None:
    section = shipped_policy.args[engine]
    reasons = {**section.deny, **section.owned, **{f: rule.reason for f, rule in section.values.items()}}
    wrong = [
        f"{refused}: advises {flag}, which {engine} {table.release} does not have"
        for refused, reason in reasons.items()
        for flag in _advised_flags(reason)
        for table in release_tables(engine).values()
        if not _knows(table, flag)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("engine", REAL_ENGINES)
def test_value_rules_are_for_flags_the_pinned_releases_have(
    shipped_policy: SecurityPolicy, engine: Engine
) -> None:
    for flag in shipped_policy.args[engine].values:
        for table in release_tables(engine).values():
            assert _knows(table, flag), (
                f"{flag} has a value rule but {engine} {table.release} has no such flag"
            )


@pytest.mark.parametrize(
    ("engine", "variable"),
    [
        (Engine.VLLM, "NCCL_IB_ADDR_FAMILY"),  # caught by *_ADDR*, but picks the node's own RoCE GID
        (Engine.VLLM, "NCCL_IB_ADDR_RANGE"),
        (Engine.LLAMACPP, "LLAMA_ARG_SWA_CHECKPOINTS"),
        (Engine.LLAMACPP, "LLAMA_ARG_KV_SPLIT"),
        (Engine.LLAMACPP, "LLAMA_ARG_GRP_ATTN_N"),  # llama-server does not even read these two
        (Engine.LLAMACPP, "LLAMA_ARG_GRP_ATTN_W"),
    ],
)
def test_tuning_variables_the_audit_found_refused_are_allowed(
    shipped_policy: SecurityPolicy, engine: Engine, variable: str
) -> None:
    assert check_env(shipped_policy, engine, {variable: "1"}) == []


def test_an_address_variable_outside_the_reviewed_exceptions_is_still_refused(
    shipped_policy: SecurityPolicy,
) -> None:
    assert check_env(shipped_policy, Engine.VLLM, {"NCCL_RAS_ADDR": "10.0.0.1:28028"})
    assert check_env(shipped_policy, Engine.VLLM, {"NCCL_IB_ADDR_FAMILY_X": "1"})


def _release_parser(table: ProgramTable) -> argparse.ArgumentParser:
    """An argparse parser with every option string of the release, each its own dest."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=True, exit_on_error=False)
    for spec in table.flags:
        for name in (*spec.names, *spec.negations):
            parser.add_argument(name, dest=name, nargs="?", default=None, const="")
    return parser


ARGPARSE_RELEASES = [(e, r) for e in (Engine.VLLM, Engine.SGLANG) for r in release_tables(e)]


@pytest.mark.parametrize(
    ("engine", "release"), ARGPARSE_RELEASES, ids=[f"{e}-{r}" for e, r in ARGPARSE_RELEASES]
)
def test_every_abbreviation_the_release_reads_as_a_refused_flag_is_refused(
    shipped_policy: SecurityPolicy, engine: Engine, release: str
) -> None:
    """Prefixes of the release's refused options, fed to a parser with all of the release's
    options (so ambiguity is what the engine would see): whatever lands on a refused one is
    refused. An exact option the policy trusts must be a real option of the release, or at
    least abbreviate nothing refused there."""
    table = release_tables(engine)[release]
    section = shipped_policy.args[engine]
    refused = {name for name in table.by_name if check_args(shipped_policy, engine, [name, "/etc/passwd"])}
    parser = _release_parser(table)
    tried = 0
    for option in sorted(refused):
        for end in range(2, len(option)):
            words = [option[:end]]
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    parsed = vars(parser.parse_args(words))
            except (SystemExit, argparse.ArgumentError):
                continue  # ambiguous or unknown: the engine would refuse to start
            landed = {dest for dest, value in parsed.items() if value is not None}
            if landed & refused:
                tried += 1
                assert check_args(shipped_policy, engine, [*words, "/etc/passwd"]), (words, landed)
    assert tried > 0
    for option in section.exact_options:
        if table.lookup(option) is None:
            abbreviated = [name for name in refused if name.startswith(option)]
            assert not abbreviated, f"{option} is trusted as exact, but {release} reads it as {abbreviated}"
