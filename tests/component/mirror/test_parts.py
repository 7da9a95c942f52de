"""The mirror's small parts: where the token comes from, settings, plain progress lines, the throttle."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from llmgw.flags import parse_rate
from llmgw.mirror.credentials import read_hub_token
from llmgw.mirror.progress import PlainProgress
from llmgw.mirror.settings import MirrorSettings
from llmgw.mirror.transfer import Throttle, safe_url

SECRET = "hf_abcdefghijklmnopqrstuvwxyz012345"


def test_token_sources_in_order_and_never_shown(tmp_path: Path) -> None:
    home = tmp_path / "home"
    default_file = home / ".cache" / "huggingface" / "token"
    default_file.parent.mkdir(parents=True)
    default_file.write_text(SECRET + "-file\n")
    assert read_hub_token({}, tmp_path / "nowhere") is None
    token = read_hub_token({}, home)
    assert token is not None and token.authorization_header() == {"Authorization": f"Bearer {SECRET}-file"}
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    (hf_home / "token").write_text(SECRET + "-hfhome")
    token = read_hub_token({"HF_HOME": str(hf_home)}, home)
    assert token is not None and token.authorization_header()["Authorization"].endswith("-hfhome")
    token = read_hub_token({"HUGGING_FACE_HUB_TOKEN": SECRET + "-legacy", "HF_HOME": str(hf_home)}, home)
    assert token is not None and token.authorization_header()["Authorization"].endswith("-legacy")
    token = read_hub_token({"HF_TOKEN": SECRET, "HUGGING_FACE_HUB_TOKEN": "other"}, home)
    assert token is not None
    assert SECRET not in repr(token) and SECRET not in str(token) and SECRET not in f"{token}"
    assert token.redact(f"failed with Bearer {SECRET}") == "failed with Bearer ***"


def test_settings_from_env_and_rates() -> None:
    settings = MirrorSettings.from_env(
        {
            "HF_ENDPOINT": "https://hf-mirror.example/",
            "LLMGW_MIRROR_RETRIES": "2",
            "LLMGW_MIRROR_BANDWIDTH_LIMIT": "50M",
        }
    )
    assert settings.hub_endpoint == "https://hf-mirror.example"
    assert settings.retries == 2 and settings.bandwidth_limit == 50 * 1024 * 1024
    own = MirrorSettings.from_env({"HF_ENDPOINT": "https://a", "LLMGW_MIRROR_HF_ENDPOINT": "http://b"})
    assert own.hub_endpoint == "http://b"
    assert parse_rate("800k") == 800 * 1024 and parse_rate("1.5G") == int(1.5 * 1024**3)
    assert parse_rate("10MB/s") == 10 * 1024**2
    for bad in ("fast", "0", "-1M"):
        with pytest.raises(ValueError):
            parse_rate(bad)
    with pytest.raises(ValueError, match="LLMGW_MIRROR_RETRIES"):
        MirrorSettings.from_env({"LLMGW_MIRROR_RETRIES": "many"})


def test_safe_url_drops_queries_and_credentials() -> None:
    assert safe_url("https://user:pw@host/x.gguf?X-Amz-Signature=s#frag") == "https://host/x.gguf"


def test_plain_progress_lines_are_throttled_per_file() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = PlainProgress(out, interval=10.0, clock=lambda: now[0])
    progress.begin(1, 1000)
    progress.start_file("a.safetensors", 1000, 0)
    for _ in range(9):
        now[0] += 1.0
        progress.advance("a.safetensors", 50)
    now[0] += 1.0
    progress.advance("a.safetensors", 50)  # 10 s after the start: one line
    progress.advance("a.safetensors", 500)
    progress.end_file("a.safetensors", True, "sha256 x verified")
    lines = out.getvalue().splitlines()
    assert lines == [
        "downloading 1 file(s), 1000 B",
        "a.safetensors: start (1000 B)",
        "a.safetensors: 500 B of 1000 B (50%), 50 B/s, ETA 10s; total 500 B of 1000 B (50%)",
        "a.safetensors: done: sha256 x verified",
    ]


def test_throttle_spaces_takes_by_the_rate_on_a_virtual_clock() -> None:
    now = [100.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    async def run() -> None:
        throttle = Throttle(rate=1000, clock=lambda: now[0], sleep=sleep)
        for _ in range(4):
            await throttle.take(100)  # 100 bytes at 1000 B/s: one slot every 0.1 s
        now[0] += 5.0  # idle: at most one second of burst is saved up
        for _ in range(12):
            await throttle.take(100)

    asyncio.run(run())
    waits = [s for s in slept if s > 1e-9]
    # The first take is free, the next three wait a slot each; after the idle
    # spell eleven takes ride the saved second (plus the current slot), the twelfth waits.
    assert waits == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert now[0] == pytest.approx(100.0 + 0.3 + 5.0 + 0.1)
