"""Codex CLI and Claude Code through `llmgw dev` to a real llama-server: the engine build the
default image deploys (``LLMGW_LLAMA_SERVER``, scripts/build-llama-server), serving catalog
models from GGUFs, each client configured exactly as the README says (test_agent_clis.py
reads its code blocks), with a key from ``llmgw ctl keys create``.

The models are bigramgguf.py's: Qwen2.5's tool-capable chat template and weights that
answer an agent's first turn with a call of its shell tool (Codex's ``exec_command``,
Claude Code's ``Bash``) and the turn after the tool's result with one word (``llama-ok``),
each ending in a stop whatever the sampling, with a packed vocabulary that reads the
agents' tens of thousands of characters of system prompt and tool schemas in seconds. So
every turn the clients send, tools and all, is rendered by llama-server's own jinja
template, answered by its own sampler, and its call parsed by its own template parser; the
router translates Responses and Messages to chat completions and back, as it does for
every llama.cpp model, and the client runs the call and sends the result.

What a user would see: the client exits 0 with the model's word as its answer; every turn
offered the client's tools, and the follow-up carried the call and the command's output (a
recording proxy before the router keeps the bodies); the router counted the requests and
refused none (no 4xx, no 5xx, background requests included); the engine itself read the
agent's prompts and predicted the answers (its own /metrics).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

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

# What each model has its client run: the client's shell tool, as Codex CLI 0.171.0 offers it
# (exec_command, {"cmd"}) and Claude Code 2.1.332 (Bash, {"command", "description"}).
TOOL_OUTPUT = "llmgw-tool-ok"
TOOL_CALLS = {
    "tiny-codex-agent": ("exec_command", {"cmd": f"echo {TOOL_OUTPUT}"}),
    "tiny-claude-agent": ("Bash", {"command": f"echo {TOOL_OUTPUT}", "description": "Print a marker"}),
}
# A context for an agent's prompt and Claude Code's max_tokens of 32,000; one slot, so the
# client's turns reuse its prompt cache; one thread of the machine's two.
CONTEXT = 131072
CATALOG = "models:" + "".join(
    f"""
  {model}:
    roles: [chat]
    profiles:
      - engine: llamacpp
        source: https://models.example.com/{model}.gguf
        gpus_per_node: 0
        args: ["--ctx-size", "{CONTEXT}", "--parallel", "1", "--threads", "1", "--metrics"]
    scaling: {{min: 1, max: 1}}"""
    for model in TOOL_CALLS
)
# An agent's first turn is thousands of tokens even packed: the engine read a real prompt.
AGENT_PROMPT_TOKENS = 2000


def tool_call(name: str, arguments: dict[str, str]) -> str:
    """A call as Qwen2.5's template writes one (and llama-server parses it)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


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
    artifacts = []
    for model, call in TOOL_CALLS.items():
        gguf = write_bigram_chat(tmp / f"{model}.gguf", context=CONTEXT, tool_call=tool_call(*call))
        artifacts += ["--artifact", f"https://models.example.com/{model}.gguf={gguf}"]
    (tmp / "catalog.yaml").write_text(CATALOG)
    previous = os.environ.get("LLMGW_LLAMA_SERVER")
    os.environ["LLMGW_LLAMA_SERVER"] = binary
    try:
        running = start_dev(
            tmp, "--catalog", str(tmp / "catalog.yaml"), "--api-keys", "--nodes", "1", *artifacts
        )  # fmt: skip
    finally:
        if previous is None:
            os.environ.pop("LLMGW_LLAMA_SERVER", None)
        else:
            os.environ["LLMGW_LLAMA_SERVER"] = previous
    try:
        key = running.create_key("agents")
        running.wait_answering(key, TOOL_CALLS, 120, every=0.5)
        yield running, key
    finally:
        running.kill()


def engine_of(running: RunningDev, model: str) -> Engine:
    [engine] = engine_urls(running, model)
    return engine


def engine_counts(engine: Engine) -> tuple[float, float]:
    """The prompt tokens the engine read (prefilled or from its cache) and the tokens it
    predicted, from llama-server's /metrics (tools/server/server-task.cpp, b11434)."""
    read = metric(engine, "llamacpp:prompt_tokens_total") + metric(
        engine, "llamacpp:prompt_tokens_cached_total"
    )
    return read, metric(engine, "llamacpp:tokens_predicted_total")


def test_codex_exec_runs_llama_servers_tool_call_and_answers_with_its_word(
    codex: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    model = "tiny-codex-agent"
    engine = engine_of(running, model)
    with RecordingProxy(running.base_url.removesuffix("/v1")) as proxy:
        env, work = codex_setup(tmp_path, proxy.url + "/v1", key, model)
        before, refused_before, (read_before, predicted_before) = (
            requests_of(running, model), refused_of(running), engine_counts(engine),
        )  # fmt: skip
        # No approval to ask for and no sandbox to set up: the command is the test's own
        # echo, run in the temporary working directory.
        bypass = "--dangerously-bypass-approvals-and-sandbox"
        done = run_client([codex, "exec", "--skip-git-repo-check", bypass, "say hello"], env, work)

    assert done.returncode == 0, done.stderr[-3000:]
    # `codex exec` prints the agent's last message, alone, on stdout: the model's word.
    assert done.stdout.strip() == ANSWER, (done.stdout, done.stderr[-3000:])
    turns = proxy.bodies("/v1/responses")
    # Every turn offered the shell tool; llama-server's call (parsed from the model's
    # text by its own template parser) reached Codex, which ran it and sent the output.
    assert len(turns) >= 2, proxy.received
    assert all(any(t.get("name") == "exec_command" for t in body.get("tools", [])) for body in turns)
    items = [item for item in turns[-1]["input"] if isinstance(item, dict)]
    calls = [item for item in items if item.get("type") == "function_call"]
    outputs = [item for item in items if item.get("type") == "function_call_output"]
    assert [(call["name"], json.loads(call["arguments"])) for call in calls] == [TOOL_CALLS[model]], items
    assert [output["call_id"] for output in outputs] == [calls[0]["call_id"]]
    assert TOOL_OUTPUT in json.dumps(outputs[0]["output"]), outputs
    assert requests_of(running, model) - before >= len(turns)
    assert refused_of(running) == refused_before
    read, predicted = engine_counts(engine)
    assert read - read_before >= AGENT_PROMPT_TOKENS
    assert predicted - predicted_before >= len(turns)


def test_claude_p_runs_llama_servers_tool_call_and_answers_with_its_word(
    claude: str, dev: tuple[RunningDev, str], tmp_path: Path
) -> None:
    running, key = dev
    model = "tiny-claude-agent"
    engine = engine_of(running, model)
    with RecordingProxy(running.base_url.removesuffix("/v1")) as proxy:
        env, work = claude_setup(tmp_path, proxy.url, key, model)
        before, refused_before, (read_before, predicted_before) = (
            requests_of(running, model), refused_of(running), engine_counts(engine),
        )  # fmt: skip
        # Bash allowed for echo alone (-p cannot ask; --dangerously-skip-permissions is
        # refused to root), in the temporary working directory.
        done = run_client([claude, "-p", "say hello", "--allowedTools", "Bash(echo:*)"], env, work)

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert done.stdout.strip() == ANSWER, (done.stdout, done.stderr[-3000:])
    # The agent's turns offered its tools (a background request, a title, may offer none).
    turns = [
        body
        for body in proxy.bodies("/v1/messages")
        if any(t.get("name") == "Bash" for t in body.get("tools", []))
    ]
    assert len(turns) >= 2, [body.get("tools") for body in proxy.bodies("/v1/messages")]
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
    assert [(use["name"], use["input"]) for use in uses] == [TOOL_CALLS[model]], follow_up[-2:]
    assert [result["tool_use_id"] for result in results] == [uses[0]["id"]]
    assert TOOL_OUTPUT in json.dumps(results[0].get("content")), results
    assert not results[0].get("is_error"), results
    assert requests_of(running, model) - before >= len(turns)
    assert refused_of(running) == refused_before
    read, predicted = engine_counts(engine)
    assert read - read_before >= AGENT_PROMPT_TOKENS
    assert predicted - predicted_before >= len(turns)


@pytest.mark.parametrize("temperature", [0.0, 1.0, 2.0])
def test_the_agent_model_calls_then_answers_at_any_temperature_through_the_router(
    dev: tuple[RunningDev, str], temperature: float
) -> None:
    """The model's contract, which the client tests lean on, held without the clients: a
    turn with tools is a call of the tool, the turn after its result the word, each ending
    in a stop, at any temperature an agent sends (chat completions through the router, the
    engine's own template, parser and sampler)."""
    running, key = dev
    model = "tiny-claude-agent"
    client = openai.OpenAI(base_url=running.base_url, api_key=key, max_retries=0, timeout=60)
    name, arguments = TOOL_CALLS[model]
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "Run a shell command",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                    "required": ["command"],
                },
            },
        }
    ]
    messages: list[Any] = [{"role": "user", "content": "say hello"}]
    sampling = {"temperature": temperature, "top_p": 1.0, "max_tokens": 32000}

    called = client.chat.completions.create(model=model, messages=messages, tools=tools, **sampling)

    [choice] = called.choices
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (name, arguments)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": TOOL_OUTPUT},
    ]

    answered = client.chat.completions.create(model=model, messages=messages, tools=tools, **sampling)

    assert [(c.finish_reason, c.message.content) for c in answered.choices] == [("stop", ANSWER)]
    # The word and the stop: two tokens, at 32,000 allowed.
    assert answered.usage is not None and answered.usage.completion_tokens == 2
