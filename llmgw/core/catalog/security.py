"""The engine security policy: which env and flags a catalog may give an engine.

llmgw decides what runs as root on every GPU node, and a catalog profile's
``args`` and ``env`` reach the engine's command line. The policy itself is data
(``policies/engine-security.yaml``, reviewed like code); this module is the one
checker every door calls: the catalog check, the admin API's apply, the
renderer, and the engine's start command.

Env is an allowlist of tuning families minus names that carry a path, plugin,
library, address or credential: a name nobody has reviewed is refused. Flags are
a denylist per engine (what reads, writes or loads code or files, and what llmgw
sets itself); where the engine's parser accepts abbreviations, a prefix of a
refused flag is refused too. A few flags whose risk is in their value (a built-in
template name or a file path) are allowed only with the values their rule admits.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from llmgw.core.catalog.model import Engine

POLICY_FILE = "policies/engine-security.yaml"

# Environment that changes which program runs or what code it loads. Whatever a
# profile or a template says, it never reaches a rendered job, and an engine
# started by llmgw refuses to run with it (PATH aside: every process has one).
# OPENSSL_CONF can load engines (shared libraries) into any process using OpenSSL.
PROCESS_ALTERING_ENV = (
    "LD_*", "PATH", "PYTHON*", "BASH_ENV", "ENV", "BROWSER", "PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT",
    "RUBYLIB", "NODE_OPTIONS", "GCONV_PATH", "SHELLOPTS", "PS4", "IFS", "DYLD_*", "GLIBC_TUNABLES",
    "OPENSSL_CONF",
)  # fmt: skip

_NEGATIVE_NUMBER = re.compile(r"^-\d+(\.\d+)?([eE][-+]?\d+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _PolicyModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvPolicy(_PolicyModel):
    allow_prefixes: tuple[StrictStr, ...] = ()
    allow_names: tuple[StrictStr, ...] = ()
    # Names a deny pattern would catch, reviewed one by one and allowed (deny_names still win):
    # NCCL_IB_ADDR_FAMILY matches *_ADDR* but only picks the node's own RoCE GID family.
    allow_despite_patterns: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    deny_patterns: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    deny_names: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    llamacpp_arg_env: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class ValueRule(_PolicyModel):
    """A flag allowed only with reviewed values: one of ``allowed``, or a full match of ``pattern``."""

    allowed: tuple[StrictStr, ...] = ()
    pattern: StrictStr | None = None
    reason: StrictStr

    def admits(self, value: str) -> bool:
        return value in self.allowed or (
            self.pattern is not None and re.fullmatch(self.pattern, value) is not None
        )


class EngineArgsPolicy(_PolicyModel):
    # The engine parses with Python's argparse (allow_abbrev): unambiguous prefixes
    # of long flags and short flags with attached values (-n2) are read as the flag.
    argparse_abbreviations: StrictBool = False
    underscore_equals_dash: StrictBool = False
    # vLLM reads --some-config.key VALUE (and --some-config+...) as --some-config, and
    # a single-dash flag likewise (-cc.backend X is -cc, --compilation-config).
    dotted_subkeys: StrictBool = False
    # Real options that are prefixes of refused ones: argparse matches an exact
    # option before trying abbreviations, so these are not abbreviations.
    exact_options: tuple[StrictStr, ...] = ()
    deny: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    owned: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    # Flags whose risk depends on the value (a built-in name or a path): refused unless the
    # value is one the rule admits.
    values: dict[StrictStr, ValueRule] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _value_rules_are_not_also_refused(self) -> EngineArgsPolicy:
        both = sorted(set(self.values) & (set(self.deny) | set(self.owned)))
        if both:
            raise ValueError(f"{both} are refused outright and have value rules: keep one")
        return self


class SecurityPolicy(_PolicyModel):
    version: Literal[1]
    env: EnvPolicy
    args: dict[Engine, EngineArgsPolicy]


@dataclass(frozen=True, slots=True)
class Violation:
    """One refused env name or argument. ``index`` is the argument's position, or None for env."""

    subject: str
    reason: str
    index: int | None = None

    @property
    def message(self) -> str:
        if self.index is None:
            return f"environment variable {self.subject} is refused: {self.reason}"
        return f"argument {self.subject} is refused: {self.reason}"


def parse_policy(data: object) -> SecurityPolicy:
    """Validate the policy file's parsed YAML. Raises pydantic's ValidationError."""
    return SecurityPolicy.model_validate(data)


def check_args(policy: SecurityPolicy, engine: Engine, args: Sequence[str]) -> list[Violation]:
    engine_policy = policy.args.get(engine)
    if engine_policy is None:
        return [Violation(engine.value, f"the policy has no args section for engine {engine}", 0)]
    violations: list[Violation] = []
    for index, arg in enumerate(args):
        reason = _refusal_of_arg(engine_policy, arg)
        if reason is None:
            reason = _refusal_of_value(engine_policy, arg, args[index + 1] if index + 1 < len(args) else None)
        if reason is not None:
            violations.append(Violation(arg if len(arg) <= 80 else arg[:77] + "...", reason, index))
    return violations


def check_env(policy: SecurityPolicy, engine: Engine, env: Mapping[str, str]) -> list[Violation]:
    violations = []
    for name in env:
        reason = _refusal_of_env(policy, engine, name)
        if reason is not None:
            violations.append(Violation(name, reason))
    return violations


def check_profile(
    policy: SecurityPolicy, engine: Engine, args: Sequence[str], env: Mapping[str, str]
) -> list[Violation]:
    """Every refusal for one profile's args and env: the check each door runs."""
    return check_args(policy, engine, args) + check_env(policy, engine, env)


@functools.cache
def _deny_matcher(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """The deny patterns as one regex, group ``p<i>`` for pattern ``i`` (a catalog of
    2,000 models checks thousands of names against dozens of patterns)."""
    alternatives = [f"(?P<p{i}>{fnmatch.translate(pattern.upper())})" for i, pattern in enumerate(patterns)]
    return re.compile("|".join(alternatives) or "(?!)")


def _refusal_of_env(policy: SecurityPolicy, engine: Engine, name: str) -> str | None:
    env = policy.env
    if not _ENV_NAME.fullmatch(name):
        return "not a valid environment variable name"
    upper = name.upper()
    if upper in env.deny_names:
        return env.deny_names[upper]
    if upper in env.allow_despite_patterns:
        return None
    # llama.cpp's argument variables are judged as the flag they stand for, before
    # the name patterns (LLAMA_ARG_NO_HOST is a flag, not a host).
    if name in env.llamacpp_arg_env:
        if engine is not Engine.LLAMACPP:
            return "LLAMA_ARG_* variables are read by llama.cpp only"
        flag = env.llamacpp_arg_env[name]
        flag_policy = policy.args.get(Engine.LLAMACPP)
        flag_reason = _refusal_of_arg(flag_policy, flag) if flag_policy is not None else None
        if flag_reason is not None:
            return f"llama.cpp reads it as {flag}, which is refused: {flag_reason}"
        return None
    if upper.startswith("LLAMA_ARG_"):
        return f"llama.cpp reads it as a flag that {POLICY_FILE} has not reviewed"
    patterns = tuple(env.deny_patterns)
    matched = _deny_matcher(patterns).match(upper)
    if matched is not None and matched.lastgroup is not None:
        return env.deny_patterns[patterns[int(matched.lastgroup[1:])]]
    if name in env.allow_names or any(name.startswith(prefix) for prefix in env.allow_prefixes):
        return None
    return f"not in the allowlist of tuning variables in {POLICY_FILE}"


_OWNED = "llmgw sets it itself"


def _refusal_of_arg(policy: EngineArgsPolicy, arg: str) -> str | None:
    if arg.startswith("@"):
        return "argparse reads further arguments from the file an @-argument names"
    if not arg.startswith("-") or arg == "-" or _NEGATIVE_NUMBER.match(arg):
        return None  # a value, not a flag
    flag = _normalised_flag(policy, arg)
    exact = _refusal_of_exact_flag(policy, flag)
    if exact is not None:
        return exact
    if not policy.argparse_abbreviations:
        return None
    if flag.startswith("--") and len(flag) > 2 and flag not in policy.exact_options:
        for table, what in ((policy.owned, _OWNED), (policy.deny, None)):
            for refused, reason in table.items():
                if refused.startswith("--") and refused.startswith(flag):
                    why = f"{what} ({reason})" if what else reason
                    return f"the engine's parser reads it as {refused}: {why}"
    if not flag.startswith("--") and flag not in policy.exact_options:
        # argparse also reads an unambiguous prefix of a single-dash option as that
        # option: vLLM's parser reads -c as -cc (--compilation-config), -t as -tp.
        for table, what in ((policy.owned, _OWNED), (policy.deny, None)):
            for refused, reason in table.items():
                if not refused.startswith("--") and refused.startswith(flag):
                    why = f"{what} ({reason})" if what else reason
                    return f"the engine's parser reads it as {refused}: {why}"
    if not flag.startswith("--") and len(flag) > 2:
        # argparse reads -n2 as -n 2 (and -O{...} as -O {...}).
        short = _refusal_of_exact_flag(policy, flag[:2])
        if short is not None:
            return f"the engine's parser reads it as {flag[:2]} with a value: {short}"
    return None


def _refusal_of_value(policy: EngineArgsPolicy, arg: str, following: str | None) -> str | None:
    """A flag with a value rule, given a value the rule does not admit (``--flag=v`` or
    ``--flag v``, also as an abbreviation or a short flag with its value attached)."""
    if not policy.values or not arg.startswith("-") or _NEGATIVE_NUMBER.match(arg):
        return None
    flag = _normalised_flag(policy, arg)
    attached = arg.split("=", 1)[1] if "=" in arg else None
    ruled = [flag] if flag in policy.values else []
    if not ruled and policy.argparse_abbreviations and flag not in policy.exact_options:
        dashes = "--" if flag.startswith("--") else "-"
        ruled = [
            name
            for name in policy.values
            if name.startswith(flag)
            and (name.startswith("--") == (dashes == "--"))
            and len(flag) > len(dashes)
        ]
        if not ruled and dashes == "-" and len(flag) > 2 and flag[:2] in policy.values and attached is None:
            ruled, attached = [flag[:2]], flag[2:]  # -Xvalue is -X value
    if following is not None and following.startswith("-") and not _NEGATIVE_NUMBER.match(following):
        following = None  # argparse does not take a flag as the value (the engine refuses to start)
    for name in ruled:
        value = attached if attached is not None else following
        rule = policy.values[name]
        if value is not None and not rule.admits(value):
            shown = value if len(value) <= 40 else value[:37] + "..."
            return f"{name} may not be {shown!r}: {rule.reason}"
    return None


def _normalised_flag(policy: EngineArgsPolicy, arg: str) -> str:
    flag = arg.split("=", 1)[0]
    if policy.dotted_subkeys:
        flag = re.split(r"[.+]", flag, maxsplit=1)[0]
    if policy.underscore_equals_dash:
        dashes = len(flag) - len(flag.lstrip("-"))
        flag = flag[:dashes] + flag[dashes:].replace("_", "-")
    return flag


def _refusal_of_exact_flag(policy: EngineArgsPolicy, flag: str) -> str | None:
    if flag in policy.owned:
        return f"{_OWNED} ({policy.owned[flag]})"
    if flag in policy.deny:
        return policy.deny[flag]
    return None
