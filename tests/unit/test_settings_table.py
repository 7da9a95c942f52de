"""Every LLMGW_* variable is in llmgw/flags.py's table, with a form, and ops/README.md documents it.

The source is searched for every ``LLMGW_`` name it mentions (in code, help and
docstrings alike): each must be a variable of the table, one of a flag family's
(the router's, the admin API's, the sim's ``Flag`` tables), or a variable llmgw only
writes into its jobs. A new variable read ad hoc, or a name mistyped in a help text,
fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw import flags
from llmgw.admin import settings as admin_settings
from llmgw.gateway import settings as router_settings
from llmgw.sim import settings as sim_settings

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "llmgw"
NAME = re.compile(r"\bLLMGW_[A-Z0-9_]*")

FAMILY_TABLES = {
    "LLMGW_ROUTER_": router_settings._FLAGS,
    "LLMGW_ADMIN_": admin_settings._FLAGS,
    "LLMGW_SIM_": sim_settings._FLAGS,
}


def _names_in_source() -> dict[str, list[str]]:
    """Every LLMGW_ name outside flags.py, with the files that mention it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "flags.py":
            continue
        for name in set(NAME.findall(path.read_text(encoding="utf-8"))):
            found.setdefault(name, []).append(str(path.relative_to(REPO)))
    return found


def _family_names() -> set[str]:
    return {spec.env for table in FAMILY_TABLES.values() for spec in table}


def test_the_families_are_the_tables_this_test_reads() -> None:
    assert set(flags.FLAG_FAMILIES) == set(FAMILY_TABLES)
    for prefix, table in FAMILY_TABLES.items():
        assert table and all(spec.env.startswith(prefix) for spec in table), prefix


def test_every_name_in_the_source_is_in_the_table() -> None:
    table = {v.name for v in flags.VARIABLES} | _family_names() | set(flags.TASK_ENVIRONMENT)
    unknown = {}
    for name, files in _names_in_source().items():
        if name.endswith("_"):  # a prefix in prose: LLMGW_ROUTER_*, LLMGW_IMAGE_{ENGINE}
            if not any(known.startswith(name) for known in table):
                unknown[name] = files
        elif name not in table:
            unknown[name] = files
    assert not unknown, f"add these to llmgw/flags.py (VARIABLES) or fix the name: {unknown}"


def test_every_variable_of_the_table_is_named_once_and_says_its_form() -> None:
    names = [v.name for v in flags.VARIABLES]
    assert len(names) == len(set(names))
    assert not set(names) & set(flags.TASK_ENVIRONMENT)
    for variable in flags.VARIABLES:
        assert NAME.fullmatch(variable.name), variable.name
        assert variable.form, variable.name
    # A family's variables are its flags' own; a standalone one may share the prefix
    # (LLMGW_ADMIN_TOKEN has no flag) but not a flag's name.
    assert not set(names) & _family_names()


def test_ops_readme_documents_every_variable_and_family() -> None:
    readme = (REPO / "ops" / "README.md").read_text(encoding="utf-8")
    documented = set(NAME.findall(readme))
    missing = [v.name for v in flags.VARIABLES if v.name not in documented]
    missing += [prefix for prefix in flags.FLAG_FAMILIES if prefix not in documented]
    assert not missing, f"ops/README.md's Settings table should name {missing}"


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        (flags.CONTROL_METRICS_PORT, "abc", "not a whole number"),
        (flags.CONTROL_METRICS_PORT, "70000", "outside 0..65535"),
        (flags.LOG_LEVEL, "loud", "DEBUG, INFO, WARNING or ERROR"),
        (flags.MIRROR_RETRIES, "-1", "negative"),
        (flags.MIRROR_CONCURRENCY, "0", "less than 1"),
        (flags.MIRROR_READ_TIMEOUT, "soon", "not a number"),
        (flags.MIRROR_BACKOFF_MAX, "inf", "finite"),
        (flags.MIRROR_BANDWIDTH_LIMIT, "fast", "50M"),
        (flags.TRUSTED_IMAGE_DIGESTS, "sha256:abc", "sha256"),
        (flags.SOURCE_ALLOWED_NETWORKS, "10.0.0.0/99", "LLMGW_SOURCE_ALLOWED_NETWORKS"),
        (flags.NODE_COMMAND, "llmgw 'unclosed", "shell-quoted"),
    ],
)
def test_a_bad_value_names_its_variable_and_the_form_expected(
    variable: flags.Variable[object], value: str, fragment: str
) -> None:
    with pytest.raises(flags.SettingError) as refused:
        variable.read({variable.name: value})
    message = str(refused.value)
    assert message.startswith(f"{variable.name}={value!r} is not {variable.form}")
    assert fragment in message


def test_an_unset_or_blank_variable_is_none_unless_empty_means_something() -> None:
    assert flags.CONTROL_METRICS_PORT.read({}) is None
    assert flags.CONTROL_METRICS_PORT.read({"LLMGW_CONTROL_METRICS_PORT": "  "}) is None
    assert flags.CONTROL_METRICS_PORT.read({"LLMGW_CONTROL_METRICS_PORT": " 9000 "}) == 9000
    assert flags.ALLOWED_IMAGES.read({"LLMGW_ALLOWED_IMAGES": ""}) == ()  # set empty: no image allowed
    assert flags.MODEL_CACHE_VOLUME.read({"LLMGW_MODEL_CACHE_VOLUME": ""}) == ""  # set empty: no volume


def test_a_flag_wins_over_its_variable_which_wins_over_the_default() -> None:
    env = {"LLMGW_LOG_LEVEL": "debug"}
    assert flags.flag_or_variable("ERROR", flags.LOG_LEVEL, env, "INFO") == "ERROR"
    assert flags.flag_or_variable(None, flags.LOG_LEVEL, env, "INFO") == "DEBUG"
    assert flags.flag_or_variable(None, flags.LOG_LEVEL, {}, "INFO") == "INFO"
