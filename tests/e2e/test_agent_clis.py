"""The README's instructions for OpenAI's Codex CLI and Claude Code, run with the real clients
(``scripts/install-agent-clis`` installs them from npm; ``$LLMGW_CODEX``, ``$LLMGW_CLAUDE``)
against ``llmgw dev --api-keys``: each configured exactly as the README says, with a key from
``llmgw ctl keys create``, answers a one-line prompt with the sim's words, and the router
counts the request. What the real clients send (their tools, reasoning, thinking, betas,
system blocks...) is what the translation has to carry: the official SDKs' tests send only
what the test writes. One `llmgw dev` serves the file's tests.

The clients talk only to the router on loopback: their homes are temporary directories,
their vendors' telemetry and update checks are switched off where they have a switch, and
every run is bounded by a timeout (a call to a vendor that cannot be reached fails, it
does not hang the test)."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.sim import vocabulary
from tests.support.waiting import eventually_sync

from .conftest import RunningDev, start_dev

pytestmark = pytest.mark.e2e

ANSWER_TOKENS = 8
CACHE = Path(os.environ.get("LLMGW_CACHE_DIR") or Path.home() / ".cache" / "llmgw")
# The agents' system prompts and tools are thousands of words (one sim token each), and
# Claude Code asks max_tokens 32000: a context that holds both. An answer that ends as a
# model's does, with a stop (an agent takes one cut at max_tokens for a failure).
# sim-guarded is screened by sim-guard: its Messages requests are judged as the chat
# completion they translate to, so Claude Code's reach the translation too (the sim
# serves Messages itself, untranslated, for an unguarded model).
CATALOG = f"""
models:
  sim-chat:
    roles: [chat]
    profiles:
      - engine: sim
        simulate_gpus: false
        args: ["--max-model-len", "1000000", "--answer-tokens", "{ANSWER_TOKENS}"]
        sim: {{tokens_per_second: 5000, load_seconds: 0.2}}
    scaling: {{min: 1, max: 1}}
  sim-guarded:
    roles: [chat]
    profiles:
      - engine: sim
        simulate_gpus: false
        args: ["--max-model-len", "1000000", "--answer-tokens", "{ANSWER_TOKENS}"]
        sim: {{tokens_per_second: 5000, load_seconds: 0.2}}
    scaling: {{min: 1, max: 1}}
  sim-guard:
    roles: [guard]
    profiles:
      - engine: sim
        simulate_gpus: false
        args: ["--max-model-len", "1000000", "--judge-unsafe-phrase", "forbidden fruit"]
        sim: {{tokens_per_second: 5000, load_seconds: 0.2}}
    scaling: {{min: 1, max: 1}}
guard_policies:
  demo: {{judge: sim-guard, models: [sim-guarded]}}
"""
RUN_TIMEOUT = 120


def installed(variable: str, name: str) -> str:
    """The client's executable, or a skip that says why there is none."""
    named = os.environ.get(variable, "").strip()
    if named:
        return named
    found = next(
        (str(p) for p in sorted(CACHE.glob(f"agent-clis-*/node_modules/.bin/{name}"), reverse=True)), None
    )
    if found:
        return found
    reason = os.environ.get("LLMGW_AGENT_CLIS_UNINSTALLED") or f"no {name} installed"
    pytest.skip(f"{reason}: run scripts/install-agent-clis (or set {variable}) for the agent CLI tests")


def greek_run(text: str) -> int:
    """The length of the longest run of the sim's words in their order (its answers are
    consecutive letters of the Greek alphabet, starting where the prompt's hash says)."""
    longest = run = 0
    previous: str | None = None
    for word in re.findall(r"[a-z]+", text):
        if word in vocabulary.GREEK and (
            previous is not None
            and vocabulary.GREEK[(vocabulary.GREEK.index(previous) + 1) % len(vocabulary.GREEK)] == word
        ):
            run += 1
        elif word in vocabulary.GREEK:
            run = 1
        else:
            run = 0
        previous = word if word in vocabulary.GREEK else None
        longest = max(longest, run)
    return longest


def requests_of(dev: RunningDev, model: str = "sim-chat") -> float:
    return dev.router_metric("llmgw_router_requests_total", model=model, status="200")


def refused_of(dev: RunningDev) -> float:
    """The requests for any model answered with a 4xx or 5xx."""
    text = urllib.request.urlopen(dev.base_url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmgw_router_requests_total{") and 'status="2' not in line
    )


def run_client(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """One non-interactive run, its stdin closed (Codex reads a piped stdin as more prompt)."""
    try:
        return subprocess.run(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=RUN_TIMEOUT, start_new_session=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{argv[0]} did not finish within {RUN_TIMEOUT}s: {exc.stderr!r}") from None


def base_env(home: Path) -> dict[str, str]:
    # Only what a shell gives every program, and a home of its own: no vendor login, no
    # proxy, nothing of this machine's own configuration.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}


def readme_block(heading: str, language: str) -> str:
    """The first ``language`` code block under ``heading`` in README.md: what a user copies."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split(f"### {heading}", 1)[1]
    return section.split(f"```{language}\n", 1)[1].split("```", 1)[0]


# Asked before `dev` by each test, so a missing client skips without starting llmgw dev.
@pytest.fixture(scope="module")
def codex() -> str:
    return installed("LLMGW_CODEX", "codex")


@pytest.fixture(scope="module")
def claude() -> str:
    return installed("LLMGW_CLAUDE", "claude")


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDev, str]]:
    tmp_path = tmp_path_factory.mktemp("agent-clis")
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    running = start_dev(
        tmp_path, "--catalog", str(tmp_path / "catalog.yaml"), "--api-keys", "--nodes", "1", "--gpus", "1"
    )
    try:
        key = running.create_key("agents")
        for model in ("sim-chat", "sim-guarded"):
            request = urllib.request.Request(
                running.base_url + "/chat/completions",
                data=json.dumps(
                    {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
                ).encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            eventually_sync(
                functools.partial(urllib.request.urlopen, request, timeout=10),
                60,
                f"{model} answering the key",
                every=0.25,
                retry_on=(urllib.error.URLError, ConnectionError),
            )
        yield running, key
    finally:
        if running.process.poll() is None:
            os.killpg(running.process.pid, signal.SIGKILL)
            running.process.wait(timeout=10)


def test_codex_exec_configured_as_the_readme_says_answers_through_the_router(
    codex: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    home, codex_home, work = tmp_path / "home", tmp_path / "codex-home", tmp_path / "work"
    for directory in (home, codex_home, work):
        directory.mkdir()
    # The README's config.toml, with this router's address and model put in.
    config = readme_block("Pointing OpenAI's Codex CLI at llmgw", "toml")
    assert 'base_url = "http://llmgw.example.internal:8080/v1"' in config
    config = config.replace("http://llmgw.example.internal:8080/v1", running.base_url)
    config = config.replace('model = "llama-3.1-8b"', 'model = "sim-chat"')
    (codex_home / "config.toml").write_text(config)
    env = {**base_env(home), "CODEX_HOME": str(codex_home), "LLMGW_API_KEY": key}
    before, refused_before = requests_of(running), refused_of(running)

    done = run_client([codex, "exec", "--skip-git-repo-check", "say hello"], env, work)

    assert done.returncode == 0, done.stderr[-3000:]
    # `codex exec` prints the agent's last message, alone, on stdout.
    assert greek_run(done.stdout) == ANSWER_TOKENS, (done.stdout, done.stderr[-3000:])
    assert requests_of(running) - before >= 1
    # Nothing it sent along the way was refused (a background request refused fails silently).
    assert refused_of(running) == refused_before


@pytest.mark.parametrize("model", ["sim-chat", "sim-guarded"])
def test_claude_p_configured_as_the_readme_says_answers_through_the_router(
    claude: str, dev: tuple[RunningDev, str], tmp_path: Path, model: str
) -> None:
    running, key = dev
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    # The README's environment, with this router's address, the key and the model put in.
    env = base_env(home)
    for line in readme_block("Pointing Claude Code (or any Anthropic client) at llmgw", "sh").splitlines():
        words = line.split("#", 1)[0].split()
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            env[name] = value
        elif words[:1] == ["unset"]:
            env.pop(words[1], None)
    assert env["ANTHROPIC_BASE_URL"] == "http://router.example:8080"
    env["ANTHROPIC_BASE_URL"] = running.base_url.removesuffix("/v1")
    env["ANTHROPIC_AUTH_TOKEN"] = key
    env["ANTHROPIC_MODEL"] = env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] = model
    # Claude Code's own switches for what it would send its vendor.
    env |= {
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    before, refused_before = requests_of(running, model), refused_of(running)

    done = run_client([claude, "-p", "say hello"], env, work)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert greek_run(done.stdout) == ANSWER_TOKENS, (done.stdout, done.stderr[-3000:])
    assert requests_of(running, model) - before >= 1
    # Nothing it sent along the way was refused (a background request refused fails silently).
    assert refused_of(running) == refused_before
