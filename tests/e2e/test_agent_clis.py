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
does not hang the test).

The second half of an agent's turn runs too: ``sim-tools-guarded`` answers a turn that
offers the client's shell tool with a call to it (``--tool-calls``), the client runs
``echo`` and sends the output back (Responses: ``function_call`` and
``function_call_output`` items; Messages: ``tool_use`` and ``tool_result`` blocks),
the guard screens that follow-up as the chat it translates to, and the model answers it
in text. The clients reach the router through a recording proxy, so the test reads the
follow-up as the router received it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.sim import vocabulary

from .conftest import RunningDev, start_dev

pytestmark = pytest.mark.e2e

ANSWER_TOKENS = 8
CACHE = Path(os.environ.get("LLMGW_CACHE_DIR") or Path.home() / ".cache" / "llmgw")
RUN_TIMEOUT = 120
# What the tools model has each client run: its shell tool, as Codex CLI 0.171.0 offers
# it (exec_command, {"cmd"}) and Claude Code 2.1.332 (Bash, {"command", "description"}).
TOOL_OUTPUT = "llmgw-tool-ok"
TOOL_CALLS = {
    "exec_command": {"cmd": f"echo {TOOL_OUTPUT}"},
    "Bash": {"command": f"echo {TOOL_OUTPUT}", "description": "Print a marker"},
}


def _sim_model(name: str, role: str, *args: str) -> str:
    """A sim model of the agents' catalog (YAML under ``models:``), with a context that
    holds their prompts and tokens fast enough for them."""
    argv = json.dumps(["--max-model-len", "1000000", *args])
    return f"""
  {name}:
    roles: [{role}]
    profiles:
      - engine: sim
        simulate_gpus: false
        args: {argv}
        sim: {{tokens_per_second: 5000, load_seconds: 0.2}}
    scaling: {{min: 1, max: 1}}"""


# The agents' system prompts and tools are thousands of words (one sim token each), and
# Claude Code asks max_tokens 32000: a context that holds both. An answer that ends as a
# model's does, with a stop (an agent takes one cut at max_tokens for a failure).
# sim-guarded is screened by sim-guard: its Messages requests are judged as the chat
# completion they translate to, so Claude Code's reach the translation too (the sim
# serves Messages itself, untranslated, for an unguarded model).
# sim-tools-guarded also calls the client's shell tool (TOOL_CALLS) before it answers.
ANSWERING = ("--answer-tokens", str(ANSWER_TOKENS))
CATALOG = (
    "models:"
    + _sim_model("sim-chat", "chat", *ANSWERING)
    + _sim_model("sim-guarded", "chat", *ANSWERING)
    + _sim_model("sim-guard", "guard", "--judge-unsafe-phrase", "forbidden fruit")
    + _sim_model("sim-tools-guarded", "chat", *ANSWERING, "--tool-calls", json.dumps(TOOL_CALLS))
    + "\nguard_policies:\n  demo: {judge: sim-guard, models: [sim-guarded, sim-tools-guarded]}\n"
)


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


def judged_safe(dev: RunningDev) -> float:
    """The requests the demo policy's judge found safe."""
    return dev.router_metric("llmgw_router_guard_seconds_count", policy="demo", verdict="safe")


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


def codex_setup(tmp_path: Path, base_url: str, key: str, model: str) -> tuple[dict[str, str], Path]:
    """The environment and working directory of a `codex exec` configured as the README
    says, with ``base_url`` (the router's /v1), the key and the model put in."""
    home, codex_home, work = tmp_path / "home", tmp_path / "codex-home", tmp_path / "work"
    for directory in (home, codex_home, work):
        directory.mkdir()
    config = readme_block("Pointing OpenAI's Codex CLI at llmgw", "toml")
    assert 'base_url = "http://llmgw.example.internal:8080/v1"' in config
    config = config.replace("http://llmgw.example.internal:8080/v1", base_url)
    config = config.replace('model = "llama-3.1-8b"', f'model = "{model}"')
    (codex_home / "config.toml").write_text(config)
    return {**base_env(home), "CODEX_HOME": str(codex_home), "LLMGW_API_KEY": key}, work


def claude_setup(tmp_path: Path, base_url: str, key: str, model: str) -> tuple[dict[str, str], Path]:
    """The environment and working directory of a `claude -p` configured as the README
    says, with ``base_url`` (the router's, no /v1), the key and the model put in."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = base_env(home)
    for line in readme_block("Pointing Claude Code (or any Anthropic client) at llmgw", "sh").splitlines():
        words = line.split("#", 1)[0].split()
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            env[name] = value
        elif words[:1] == ["unset"]:
            env.pop(words[1], None)
    assert env["ANTHROPIC_BASE_URL"] == "http://router.example:8080"
    env["ANTHROPIC_BASE_URL"] = base_url
    env["ANTHROPIC_AUTH_TOKEN"] = key
    env["ANTHROPIC_MODEL"] = env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] = model
    # Claude Code's own switches for what it would send its vendor.
    env |= {
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return env, work


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
        running.wait_answering(key, ("sim-chat", "sim-guarded", "sim-tools-guarded"), 60, every=0.25)
        yield running, key
    finally:
        running.kill()


def test_codex_exec_configured_as_the_readme_says_answers_through_the_router(
    codex: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    env, work = codex_setup(tmp_path, running.base_url, key, "sim-chat")
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
    env, work = claude_setup(tmp_path, running.base_url.removesuffix("/v1"), key, model)
    before, refused_before = requests_of(running, model), refused_of(running)

    done = run_client([claude, "-p", "say hello"], env, work)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert greek_run(done.stdout) == ANSWER_TOKENS, (done.stdout, done.stderr[-3000:])
    assert requests_of(running, model) - before >= 1
    # Nothing it sent along the way was refused (a background request refused fails silently).
    assert refused_of(running) == refused_before


# --- the second half of a turn: a tool call and its result -----------------------------------


class RecordingProxy:
    """Forwards every request to the router as it is and keeps its path and JSON body, in
    order: what the router received, for the test to read. Its own event loop, in a thread
    (the clients are subprocesses the test waits on)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.received: list[tuple[str, Any]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append((request.path, json.loads(body) if body else None))
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in ("host", "content-length", "transfer-encoding", "accept-encoding")
        }
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method, self.upstream + request.path_qs, headers=headers, data=body
            ) as up,
        ):
            answer = web.StreamResponse(
                status=up.status,
                headers={
                    k: v for k, v in up.headers.items() if k.lower() in ("content-type", "cache-control")
                },
            )
            await answer.prepare(request)
            async for data in up.content.iter_any():
                await answer.write(data)
            await answer.write_eof()
            return answer

    async def _start(self) -> web.AppRunner:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        return runner

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        self._runner = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bodies(self, path: str) -> list[Any]:
        return [body for received, body in self.received if received == path]


def test_codex_exec_runs_the_models_shell_call_and_sends_its_output_back(
    codex: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    model = "sim-tools-guarded"
    with RecordingProxy(running.base_url.removesuffix("/v1")) as proxy:
        env, work = codex_setup(tmp_path, proxy.url + "/v1", key, model)
        before, refused_before, judged_before = (
            requests_of(running, model),
            refused_of(running),
            judged_safe(running),
        )
        # No approval to ask for and no sandbox to set up: the command is the test's own
        # echo, run in the temporary working directory.
        bypass = "--dangerously-bypass-approvals-and-sandbox"
        done = run_client([codex, "exec", "--skip-git-repo-check", bypass, "say hello"], env, work)

    assert done.returncode == 0, done.stderr[-3000:]
    asked = proxy.bodies("/v1/responses")
    # The first turn offered the shell tool; the model called it; the next request carries
    # the call and the command's output, which the router took (translated, screened) and
    # the model answered in text: the CLI's last message.
    assert any(tool.get("name") == "exec_command" for tool in asked[0]["tools"])
    follow_up = asked[-1]
    items = [item for item in follow_up["input"] if isinstance(item, dict)]
    calls = [item for item in items if item.get("type") == "function_call"]
    outputs = [item for item in items if item.get("type") == "function_call_output"]
    assert [json.loads(call["arguments"]) for call in calls] == [TOOL_CALLS["exec_command"]], items[-3:]
    assert [output["call_id"] for output in outputs] == [calls[0]["call_id"]]
    assert TOOL_OUTPUT in json.dumps(outputs[0]["output"]), outputs
    assert greek_run(done.stdout) == ANSWER_TOKENS, (done.stdout, done.stderr[-3000:])
    assert requests_of(running, model) - before >= 2
    assert judged_safe(running) - judged_before >= 2  # the follow-up with the output too
    assert refused_of(running) == refused_before


def test_claude_p_runs_the_models_bash_call_and_sends_its_output_back(
    claude: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    model = "sim-tools-guarded"
    with RecordingProxy(running.base_url.removesuffix("/v1")) as proxy:
        env, work = claude_setup(tmp_path, proxy.url, key, model)
        before, refused_before, judged_before = (
            requests_of(running, model),
            refused_of(running),
            judged_safe(running),
        )
        # Bash allowed for echo alone (-p cannot ask; --dangerously-skip-permissions is
        # refused to root), in the temporary working directory.
        done = run_client([claude, "-p", "say hello", "--allowedTools", "Bash(echo:*)"], env, work)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    turns = [
        body
        for body in proxy.bodies("/v1/messages")
        if any(t.get("name") == "Bash" for t in body.get("tools", []))
    ]
    follow_up = turns[-1]["messages"]
    uses = [
        block
        for message in follow_up
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_use"
    ]
    results = [
        block
        for block in follow_up[-1]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert [(use["name"], use["input"]) for use in uses] == [("Bash", TOOL_CALLS["Bash"])], follow_up[-2:]
    assert [result["tool_use_id"] for result in results] == [uses[0]["id"]]
    assert TOOL_OUTPUT in json.dumps(results[0].get("content")), results
    assert not results[0].get("is_error"), results
    assert greek_run(done.stdout) == ANSWER_TOKENS, (done.stdout, done.stderr[-3000:])
    assert requests_of(running, model) - before >= 2
    assert judged_safe(running) - judged_before >= 2  # the follow-up with the output too
    assert refused_of(running) == refused_before
