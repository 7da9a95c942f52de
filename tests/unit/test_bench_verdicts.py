"""The router bench's verdicts (bench/router_proxy.py): each target judged from the
medians it measured, as an operator reading the last lines of its output sees it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

# Loaded from its file: bench/ is scripts, not a package on the path.
_SPEC = importlib.util.spec_from_file_location(
    "llmgw_bench_router_proxy", Path(__file__).resolve().parents[2] / "bench" / "router_proxy.py"
)
assert _SPEC is not None and _SPEC.loader is not None
router_proxy = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = router_proxy  # its dataclasses look their module up there
_SPEC.loader.exec_module(router_proxy)


def _verdicts(capsys: pytest.CaptureFixture[str], **whole: float) -> dict[str, str]:
    streaming = {"tokens_ratio": 0.999, "router ttft_p50": 0.6, "router ttft_p99": 1.2}
    router_proxy.verdicts(streaming, {"tokens_ratio": 0.998, **whole})
    lines = capsys.readouterr().out.splitlines()[2:]
    # Each line: two spaces, the target padded to 56 characters, its figure, its verdict.
    return {line[2:58].strip(): line.rstrip() for line in lines}


def _whole(router: float, plain: float | None, nginx: float | None = None) -> dict[str, float]:
    figures = {"router latency_p50": router}
    if plain is not None:
        figures["bare-aiohttp latency_p50"] = plain
    if nginx is not None:
        figures["nginx latency_p50"] = nginx
        figures["bare-asyncio latency_p50"] = 0.3
    return figures


def test_every_target_is_judged_and_the_worded_nginx_target_is_shown_beside_the_plain_proxy_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _verdicts(capsys, **_whole(router=0.9, plain=0.5, nginx=0.1))

    assert lines["tokens/s through the router >= 0.97 of direct"].endswith(" met")
    assert lines["added time to first token p50 < 1 ms"].endswith(" met")
    assert lines["added time to first token p99 < 5 ms"].endswith(" met")
    assert "+0.90 vs +0.50 ms: 1.80x" in lines["added latency p50 <= 2x a plain aiohttp proxy's"]
    assert lines["added latency p50 <= 2x a plain aiohttp proxy's"].endswith(" met")
    assert lines["as the issue words it: <= 2x nginx's"].endswith("NOT MET")
    assert "+0.30 ms: 3.00x nginx's" in lines["the least a Python proxy adds (bare asyncio protocol)"]


def test_a_router_over_twice_the_plain_proxy_or_a_slow_first_token_is_not_met(
    capsys: pytest.CaptureFixture[str],
) -> None:
    streaming = {"tokens_ratio": 0.96, "router ttft_p50": 1.01, "router ttft_p99": 5.2}
    router_proxy.verdicts(streaming, {"tokens_ratio": 0.999, **_whole(router=1.1, plain=0.5)})
    out = capsys.readouterr().out

    assert out.count("NOT MET") == 4
    assert "0.960" in out  # the worse of the two modes' ratios
    assert "2.20x" in out


def test_no_ratio_is_judged_against_a_reference_within_the_noise_of_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _verdicts(capsys, **_whole(router=0.9, plain=0.02, nginx=-0.1))

    plain = lines["added latency p50 <= 2x a plain aiohttp proxy's"]
    assert "(noise)" in plain
    assert not plain.endswith("met")
    assert "nginx adds -0.10 ms (noise)" in lines["as the issue words it: <= 2x nginx's"]


def test_without_the_plain_proxy_the_bench_says_so_instead_of_judging(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _verdicts(capsys, **_whole(router=0.9, plain=None))

    assert "no plain proxy (--no-floors)" in lines["added latency p50 <= 2x a plain aiohttp proxy's"]


def test_the_stage_timings_of_both_proxies_are_printed_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coarse = {"the task to the engine write": 110.4}
    (tmp_path / "bare-aiohttp.json").write_text(
        json.dumps({"requests": 500, "coarse": coarse, "fine": {"task -> observe": None}})
    )
    (tmp_path / "router.json").write_text(
        json.dumps(
            {
                "requests": 512,
                "coarse": {"the task to the engine write": 324.6},
                "fine": {"task -> observe": 55.0},
            }
        )
    )

    router_proxy.stages_report(tmp_path)
    out = capsys.readouterr().out

    row = next(line for line in out.splitlines() if "the task to the engine write" in line)
    assert row.split()[-2:] == ["110", "325"]  # bare-aiohttp, then router: alphabetical, as the header
    assert "task -> observe" in out and "55" in out
    assert "requests timed: bare-aiohttp 500, router 512" in out


def test_a_router_that_wrote_no_timings_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    router_proxy.stages_report(tmp_path)

    assert "the router wrote no timings" in capsys.readouterr().out
