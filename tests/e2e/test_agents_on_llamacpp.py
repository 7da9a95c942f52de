"""Codex CLI and Claude Code through `llmgw dev` to a real llama-server: the engine build the
default image deploys (``LLMGW_LLAMA_SERVER``, scripts/build-llama-server), serving a
catalog model from a GGUF, each client configured exactly as the README says
(test_agent_clis.py reads its code blocks).

The model is bigramgguf.py's: a tool-capable chat template (Qwen2.5's) and weights that
answer every turn with one word (``llama-ok``) and a stop, whatever the sampling, with a
packed vocabulary that reads an agent's tens of thousands of characters of system prompt
and tool schemas in seconds. So every turn the clients send, tools and all, is rendered by
llama-server's own jinja template and answered by its own sampler; the router translates
Responses and Messages to chat completions for it, as it does for every llama.cpp model.

What a user would see: the client exits 0 with the model's word as its answer; the router
counted its requests and refused none (no 4xx, no 5xx, background requests included); the
engine itself prefilled the agent's prompt and predicted the answer (its own /metrics); and
every turn offered the client's tools (a recording proxy before the router keeps the bodies).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import eventually_sync

from .bigramgguf import ANSWER, write_bigram_chat
from .conftest import RunningDev, start_dev
from .test_agent_clis import (
    RecordingProxy,
    claude_setup,
    codex_setup,
    installed,
    refused_of,
    requests_of,
    run_client,
)
from .test_llamacpp_e2e import Engine, engine_urls, llama_server, metric

pytestmark = pytest.mark.e2e

MODEL = "tiny-agent"
SOURCE = "https://models.example.com/tiny-agent.gguf"
# A context for an agent's prompt and Claude Code's max_tokens of 32,000; one slot, so the
# client's turns reuse its prompt cache; one thread of the machine's two.
CONTEXT = 131072
CATALOG = f"""
models:
  {MODEL}:
    roles: [chat]
    profiles:
      - engine: llamacpp
        source: {SOURCE}
        gpus_per_node: 0
        args: ["--ctx-size", "{CONTEXT}", "--parallel", "1", "--threads", "1", "--metrics"]
    scaling: {{min: 1, max: 1}}
"""
# An agent's first turn is thousands of tokens even packed: the engine read a real prompt.
AGENT_PROMPT_TOKENS = 2000


@pytest.fixture(scope="module")
def codex() -> str:
    return installed("LLMGW_CODEX", "codex")


@pytest.fixture(scope="module")
def claude() -> str:
    return installed("LLMGW_CLAUDE", "claude")


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDev, str]]:
    binary = llama_server()
    tmp = tmp_path_factory.mktemp("agents-llamacpp")
    gguf = write_bigram_chat(tmp / "tiny-agent.gguf", context=CONTEXT)
    (tmp / "catalog.yaml").write_text(CATALOG)
    previous = os.environ.get("LLMGW_LLAMA_SERVER")
    os.environ["LLMGW_LLAMA_SERVER"] = binary
    try:
        running = start_dev(
            tmp, "--catalog", str(tmp / "catalog.yaml"), "--api-keys", "--nodes", "1",
            "--artifact", f"{SOURCE}={gguf}",
        )  # fmt: skip
    finally:
        if previous is None:
            os.environ.pop("LLMGW_LLAMA_SERVER", None)
        else:
            os.environ["LLMGW_LLAMA_SERVER"] = previous
    try:
        key = running.create_key("agents")
        request = urllib.request.Request(
            running.base_url + "/chat/completions",
            data=json.dumps(
                {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        eventually_sync(
            functools.partial(urllib.request.urlopen, request, timeout=30),
            120,
            f"{MODEL} answering the key",
            every=0.5,
            retry_on=(urllib.error.URLError, ConnectionError),
        )
        yield running, key
    finally:
        if running.process.poll() is None:
            os.killpg(running.process.pid, signal.SIGKILL)
            running.process.wait(timeout=10)


def engine_of(running: RunningDev) -> Engine:
    [engine] = engine_urls(running, MODEL)
    return engine


def engine_counts(engine: Engine) -> tuple[float, float]:
    """The prompt tokens the engine read (prefilled or from its cache) and the tokens it
    predicted, from llama-server's /metrics (tools/server/server-task.cpp, b11434)."""
    read = metric(engine, "llamacpp:prompt_tokens_total") + metric(
        engine, "llamacpp:prompt_tokens_cached_total"
    )
    return read, metric(engine, "llamacpp:tokens_predicted_total")


def test_codex_exec_with_its_tools_is_answered_by_llama_server(
    codex: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    engine = engine_of(running)
    with RecordingProxy(running.base_url.removesuffix("/v1")) as proxy:
        env, work = codex_setup(tmp_path, proxy.url + "/v1", key, MODEL)
        before, refused_before, (read_before, predicted_before) = (
            requests_of(running, MODEL), refused_of(running), engine_counts(engine),
        )  # fmt: skip
        done = run_client([codex, "exec", "--skip-git-repo-check", "say hello"], env, work)

    assert done.returncode == 0, done.stderr[-3000:]
    # `codex exec` prints the agent's last message, alone, on stdout: the model's word.
    assert done.stdout.strip() == ANSWER, (done.stdout, done.stderr[-3000:])
    turns = proxy.bodies("/v1/responses")
    assert turns, proxy.received
    assert all(any(t.get("name") == "exec_command" for t in body.get("tools", [])) for body in turns), [
        [t.get("name") for t in body.get("tools", [])] for body in turns
    ]
    assert requests_of(running, MODEL) - before >= len(turns)
    assert refused_of(running) == refused_before
    read, predicted = engine_counts(engine)
    assert read - read_before >= AGENT_PROMPT_TOKENS
    assert predicted - predicted_before >= len(turns)


def test_claude_p_with_its_tools_is_answered_by_llama_server(
    claude: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    engine = engine_of(running)
    with RecordingProxy(running.base_url.removesuffix("/v1")) as proxy:
        env, work = claude_setup(tmp_path, proxy.url, key, MODEL)
        before, refused_before, (read_before, predicted_before) = (
            requests_of(running, MODEL), refused_of(running), engine_counts(engine),
        )  # fmt: skip
        done = run_client([claude, "-p", "say hello"], env, work)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert done.stdout.strip() == ANSWER, (done.stdout, done.stderr[-3000:])
    # The agent's turn offered its tools (background requests, a title, may offer none).
    turns = [
        body
        for body in proxy.bodies("/v1/messages")
        if any(t.get("name") == "Bash" for t in body.get("tools", []))
    ]
    assert turns, [body.get("tools") for body in proxy.bodies("/v1/messages")]
    assert requests_of(running, MODEL) - before >= len(turns)
    assert refused_of(running) == refused_before
    read, predicted = engine_counts(engine)
    assert read - read_before >= AGENT_PROMPT_TOKENS
    assert predicted - predicted_before >= len(turns)
