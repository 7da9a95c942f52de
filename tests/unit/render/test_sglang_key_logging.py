"""SGLang logs its whole ServerArgs, API key included: rank 0 gets a logging config that drops that record.

The config is applied here as SGLang 0.5.3 applies it (``configure_logger``,
``sglang/srt/utils/common.py``: ``json.loads`` of the file ``SGLANG_LOGGING_CONFIG_PATH``
names, then ``logging.config.dictConfig``), in a fresh interpreter whose loggers exist
before the config is loaded, as SGLang's modules make theirs at import.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.core.catalog import SecurityPolicy, load_catalog
from llmgw.render import Renderer, RenderSettings, ReplicaRequest

KEY = "llmgw-ek-0123456789abcdef"
# What _launch_subprocesses logs (f"{server_args=}", sglang/srt/entrypoints/engine.py, 0.5.3).
SERVER_ARGS_RECORD = f"server_args=ServerArgs(model_path='org/m', api_key='{KEY}', log_level='info')"
SCHEDULER_RECORD = "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16"
CONFIG_PATH = "${NOMAD_TASK_DIR}/sglang-logging.json"
# configure_logger's basicConfig: f"[%(asctime)s{prefix}] %(message)s", "%Y-%m-%d %H:%M:%S".
SGLANG_LINE = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] (?P<message>.*)$")

# Both loggers made before configure_logger runs, as SGLang's module-level getLogger(__name__).
_ENGINE_PROCESS = """
import json, logging, logging.config, os, sys
engine = logging.getLogger("sglang.srt.entrypoints.engine")
scheduler = logging.getLogger("sglang.srt.managers.scheduler")
if path := os.getenv("SGLANG_LOGGING_CONFIG_PATH"):
    with open(path, encoding="utf-8") as file:
        logging.config.dictConfig(json.loads(file.read()))
else:  # configure_logger without the variable, --log-level info
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)
engine.info(sys.argv[1])
scheduler.info(sys.argv[2])
scheduler.debug("a debug line")
engine.error("Scheduler or DataParallelController 7 terminated with 1")
"""


def _render(profile: str, policy: SecurityPolicy, *, keys: bool = True) -> list[dict]:  # type: ignore[type-arg]
    text = f"models:\n  m:\n    profiles: [{profile}]\n"
    loaded = load_catalog(text, filename="c", policy=policy)
    assert loaded.catalog is not None, [d.message for d in loaded.diagnostics]
    renderer = Renderer(RenderSettings(engine_api_keys=keys), policy)
    fabric = "f" if "nodes: 2" in profile else None
    rendered = renderer.render(loaded.catalog, ReplicaRequest("m", 0, "r1", fabric), catalog_hash="h")
    groups: list[dict] = renderer.check(rendered, model="m")["TaskGroups"]  # type: ignore[type-arg]
    return [next(t for t in group["Tasks"] if t["Name"] == "engine") for group in groups]


def _logging_template(task: dict) -> dict | None:  # type: ignore[type-arg]
    found = [t for t in task.get("Templates") or [] if t["DestPath"] == "local/sglang-logging.json"]
    assert len(found) <= 1
    return found[0] if found else None


def _run_engine(tmp_path: Path, config_text: str | None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if config_text is not None:
        config = tmp_path / "sglang-logging.json"
        config.write_text(config_text, encoding="utf-8")
        env["SGLANG_LOGGING_CONFIG_PATH"] = str(config)
    done = subprocess.run(
        [sys.executable, "-I", "-c", _ENGINE_PROCESS, SERVER_ARGS_RECORD, SCHEDULER_RECORD],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == ""
    return done.stderr.splitlines()


def test_rank_0_with_a_key_loads_a_logging_config_nomad_writes_and_workers_do_not(
    shipped_policy: SecurityPolicy,
) -> None:
    rank0, *workers = _render("{engine: sglang, source: org/m, tp: 8, nodes: 2}", shipped_policy)
    template = _logging_template(rank0)
    assert template is not None
    assert template.get("Envvars", False) is False
    assert "{{" not in template["EmbeddedTmpl"]  # nothing for Nomad's template engine to evaluate
    config = json.loads(template["EmbeddedTmpl"])
    assert config["disable_existing_loggers"] is False
    assert config["loggers"] == {"sglang.srt.entrypoints.engine": {"level": "WARNING"}}
    assert rank0["Env"]["SGLANG_LOGGING_CONFIG_PATH"] == CONFIG_PATH
    assert workers
    for worker in workers:
        assert _logging_template(worker) is None
        assert "SGLANG_LOGGING_CONFIG_PATH" not in (worker.get("Env") or {})


def test_without_a_key_sglang_keeps_its_own_logging(shipped_policy: SecurityPolicy) -> None:
    [engine] = _render("{engine: sglang, source: org/m}", shipped_policy, keys=False)
    assert _logging_template(engine) is None
    assert "SGLANG_LOGGING_CONFIG_PATH" not in (engine.get("Env") or {})


def test_the_rendered_config_drops_the_server_args_record_and_keeps_sglangs_other_lines(
    shipped_policy: SecurityPolicy, tmp_path: Path
) -> None:
    [engine] = _render("{engine: sglang, source: org/m}", shipped_policy)
    template = _logging_template(engine)
    assert template is not None
    lines = _run_engine(tmp_path, template["EmbeddedTmpl"])
    assert not [line for line in lines if KEY in line or "server_args=" in line]
    messages = [match["message"] for line in lines if (match := SGLANG_LINE.match(line))]
    assert messages == [SCHEDULER_RECORD, "Scheduler or DataParallelController 7 terminated with 1"]
    assert len(lines) == len(messages)  # every line in SGLang's own format


def test_without_the_config_sglangs_default_logging_writes_the_key(tmp_path: Path) -> None:
    """What the config is for: SGLang's basicConfig writes the record with the key."""
    lines = _run_engine(tmp_path, None)
    assert [line for line in lines if KEY in line]
    assert all(SGLANG_LINE.match(line) for line in lines)


@pytest.mark.parametrize(
    ("args", "debug_shown"), [("[--log-level, debug]", True), ("[--log-level=error]", False)]
)
def test_the_profiles_log_level_still_sets_sglangs_level(
    args: str, debug_shown: bool, shipped_policy: SecurityPolicy, tmp_path: Path
) -> None:
    [engine] = _render(f"{{engine: sglang, source: org/m, args: {args}}}", shipped_policy)
    template = _logging_template(engine)
    assert template is not None
    lines = _run_engine(tmp_path, template["EmbeddedTmpl"])
    assert not [line for line in lines if KEY in line]
    assert any(line.endswith("a debug line") for line in lines) is debug_shown
    assert any(line.endswith(SCHEDULER_RECORD) for line in lines) is debug_shown


def test_a_catalog_cannot_name_a_logging_config_of_its_own(shipped_policy: SecurityPolicy) -> None:
    profile = "{engine: sglang, source: org/m, env: {SGLANG_LOGGING_CONFIG_PATH: /tmp/l.json}}"
    text = f"models:\n  m:\n    profiles: [{profile}]\n"
    loaded = load_catalog(text, filename="c", policy=shipped_policy)
    assert loaded.catalog is None
    [message] = [d.message for d in loaded.diagnostics if "SGLANG_LOGGING_CONFIG_PATH" in d.message]
    assert "refused" in message and "engine key" in message


def test_a_policy_that_lets_a_catalog_set_it_still_leaves_rank_0_llmgws_config(
    shipped_policy: SecurityPolicy,
) -> None:
    name = "SGLANG_LOGGING_CONFIG_PATH"
    deny_names = {k: v for k, v in shipped_policy.env.deny_names.items() if k != name}
    allowed = {**shipped_policy.env.allow_despite_patterns, name: "an operator's choice"}
    env = shipped_policy.env.model_copy(update={"deny_names": deny_names, "allow_despite_patterns": allowed})
    lenient = shipped_policy.model_copy(update={"env": env})
    profile = "{engine: sglang, source: org/m, env: {SGLANG_LOGGING_CONFIG_PATH: /tmp/l.json}}"
    [engine] = _render(profile, lenient)
    assert engine["Env"]["SGLANG_LOGGING_CONFIG_PATH"] == CONFIG_PATH
