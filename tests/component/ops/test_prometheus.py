"""ops/prometheus: the scrape configuration and alert rules operators deploy, checked by the
real promtool (Debian's `prometheus` package) and held to what llmgw registers and exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmgw.core import conventions
from llmgw.core.catalog.model import Engine
from tests.support.exposition import all_names, queried_metrics

OPS = Path(__file__).resolve().parents[3] / "ops" / "prometheus"
CONFIG = OPS / "prometheus.yml"
RULES = OPS / "rules" / "llmgw.rules.yml"
RULE_TESTS = OPS / "tests" / "llmgw.rules.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus; .ci/run does)"
)


def _promtool(*args: str, cwd: Path = OPS) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _has_consul_sd() -> bool:
    """Debian builds Prometheus without Consul service discovery (disabled in 2.33.5+ds1-4,
    "until its Debian package is back in shape"; still so in bookworm's 2.42 and trixie's
    2.53): its promtool refuses every consul_sd_configs block."""
    probe = "scrape_configs:\n  - job_name: probe\n    consul_sd_configs: [{server: '127.0.0.1:1'}]\n"
    done = subprocess.run(
        [PROMTOOL or "promtool", "check", "config", "/dev/stdin"],
        input=probe, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode == 0


@needs_promtool
def test_the_rules_are_valid_prometheus_rules() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_every_alert_fires_and_stays_quiet_as_its_rule_tests_say() -> None:
    done = _promtool("test", "rules", str(RULE_TESTS.relative_to(OPS)))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_rule_tests_fail_when_a_threshold_moves(tmp_path: Path) -> None:
    """The rule tests can fail: the shipped tests against rules whose error threshold is
    ten times higher report the alert that no longer fires."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    moved = RULES.read_text().replace("ratio_rate5m > 0.05", "ratio_rate5m > 0.5")
    assert moved != RULES.read_text()
    (tmp_path / "rules" / RULES.name).write_text(moved)
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    done = _promtool("test", "rules", f"tests/{RULE_TESTS.name}", cwd=tmp_path)
    assert done.returncode != 0
    assert "LlmgwHighErrorRate" in done.stdout + done.stderr


def test_every_alert_has_a_rule_test() -> None:
    alerts = {
        rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
        if "alert" in rule
    }  # fmt: skip
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", ())
        if case.get("exp_alerts")
    }
    assert alerts and alerts <= tested, f"alerts no rule test sees firing: {sorted(alerts - tested)}"


def test_every_rule_queries_metrics_llmgw_exposes() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    known = all_names() | recorded
    for group in groups:
        for rule in group["rules"]:
            missing = queried_metrics(rule["expr"]) - known
            assert not missing, f"{rule.get('alert') or rule.get('record')} queries {sorted(missing)}"


def test_the_metric_check_catches_a_misspelt_name() -> None:
    assert queried_metrics("rate(llmgw_router_request_total[5m])") - all_names() == {
        "llmgw_router_request_total"
    }


@needs_promtool
def test_the_scrape_configuration_is_valid_prometheus_configuration() -> None:
    if not _has_consul_sd():
        pytest.skip(
            "this promtool was built without Consul service discovery (Debian's prometheus "
            "package disables it); upstream builds and the prom/prometheus image have it"
        )
    done = _promtool("check", "config", str(CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr


def _consul_jobs() -> dict[str, tuple[list[dict[str, object]], list[dict[str, object]]]]:
    config = yaml.safe_load(CONFIG.read_text())
    return {
        job["job_name"]: (job["consul_sd_configs"], job.get("relabel_configs", []))
        for job in config["scrape_configs"]
    }


def test_the_scrape_jobs_find_the_services_llmgw_registers() -> None:
    services = {
        name: [s for sd in sds for s in sd["services"]] for name, (sds, _) in _consul_jobs().items()
    }  # fmt: skip
    assert services == {
        "llmgw-router": [conventions.ROUTER_SERVICE],
        "llmgw-control": [conventions.CONTROL_METRICS_SERVICE],
        "llmgw-engine": [conventions.ENGINE_SERVICE],
    }
    for sds, _ in _consul_jobs().values():
        for sd in sds:
            # A datacenter spares Prometheus's /v1/agent/self (and its token an agent rule);
            # the token is read from a file, never written in the configuration.
            assert sd["datacenter"] and "token" not in sd
            assert sd["authorization"] == {"credentials_file": "/etc/prometheus/consul.token"}


def test_relabelling_reads_only_meta_llmgw_registers() -> None:
    meta_keys = {
        value
        for name, value in vars(conventions).items()
        if name.startswith("META_") and isinstance(value, str)
    }
    engines = {engine.value for engine in Engine}
    for _, relabels in _consul_jobs().values():
        for relabel in relabels:
            for label in relabel.get("source_labels", ()):  # type: ignore[attr-defined]
                meta = re.fullmatch(r"__meta_consul_service_metadata_(\w+)", str(label))
                if meta:
                    assert meta.group(1) in meta_keys, f"no llmgw registration carries meta {meta.group(1)}"
                else:
                    assert label == "__meta_consul_node", label
            if relabel.get("action") == "keep":
                assert set(str(relabel["regex"]).split("|")) <= engines


def test_the_llmgw_job_registers_every_service_the_scrape_finds_with_the_meta_it_reads() -> None:
    from llmgw.apispec.jobspec import parse_jobspec

    job_file = OPS.parent / "llmgw.nomad.hcl"
    job = parse_jobspec(job_file.read_text(), filename=job_file.name, variables={"datacenters": ["dc1"]})
    registered = {
        service["Name"]: (group, service)
        for group in job["TaskGroups"]
        for service in group.get("Services") or ()
    }
    for name in (conventions.ROUTER_SERVICE, conventions.CONTROL_METRICS_SERVICE):
        group, service = registered[name]
        assert service["Meta"] == {conventions.META_ALLOC: "${NOMAD_ALLOC_ID}"}
        assert [check["Path"] for check in service["Checks"]] == ["/health"]
        # The port the service names is the one the task listens on, on every address.
        args = " ".join(group["Tasks"][0]["Config"]["args"])
        assert f"${{NOMAD_PORT_{service['PortLabel']}}}" in args
        assert "0.0.0.0" in args
