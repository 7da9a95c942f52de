"""Prefix affinity on real engines: three llama-server replicas of one model under `llmgw dev`.

llama-server (build 11434) keeps each slot's last prompt and reads the longest common
prefix of the next one from it (``cache_prompt``, on by default: tools/server/server-task.h;
``get_available_slot`` in server-context.cpp picks the slot whose prompt shares the most),
and says how much it read in the answer's ``usage.prompt_tokens_details.cached_tokens``
(``usage_json_oaicompat``, tools/server/server-task.cpp) and in its own ``/metrics``
(``llamacpp:prompt_tokens_cached_total``, and ``llamacpp:prompt_tokens_total`` for the
tokens it computed). Those counts, the replica the router names in ``x-llmgw-replica``
and the router's own metrics are what these tests read:

- a session's first turn goes where the load is least (nothing of it is cached yet), and
  its later turns all go to one replica, which reads each turn's earlier turns from its
  cache (the other replicas compute none of those turns' tokens);
- one conversation continued by many clients at once spreads past its owner's load bound
  to the next replicas in its order, each of which then holds it in its cache.

The model is tinygguf.py's random-weight llama: its answers are noise, its prompt
processing and cache are llama-server's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmgw.core import routing
from llmgw.core.conventions import META_JOB
from llmgw.core.engine_keys import KEY_ITEM, variable_path
from tests.support.waiting import eventually_sync

from .conftest import RunningDev, start_dev
from .test_llamacpp_e2e import Engine, consul, direct, llama_server, metric, serving
from .tinygguf import write_llama

pytestmark = pytest.mark.e2e

MODEL = "tiny-chat"
URL = "https://models.example.com/tiny-chat.gguf"
REPLICAS = 3
# Four slots of 8,192 tokens each (a slot is --ctx-size / --parallel without a unified KV
# cache, and at most the context the model was trained on: the GGUF says 8,192), so a
# replica takes every stream the load bound gives it at once and a stream can run for
# seconds; one thread each of the machine's two; --metrics for the engine's counts.
CATALOG = f"""
models:
  {MODEL}:
    roles: [chat]
    profiles:
      - engine: llamacpp
        source: {URL}
        gpus_per_node: 0
        args: ["--ctx-size", "32768", "--parallel", "4", "--threads", "1", "--metrics"]
    scaling: {{min: {REPLICAS}, max: {REPLICAS}}}
"""
CACHED = "llamacpp:prompt_tokens_cached_total"
COMPUTED = "llamacpp:prompt_tokens_total"
# Never </s> (token 2): a stream runs until its client leaves.
ENDLESS = {"logit_bias": {"2": -100}}


def replicas(dev: RunningDev) -> dict[str, Engine]:
    """The passing engines of the model by replica (its Nomad job, which ``x-llmgw-replica``
    and the router's metrics name)."""
    found: dict[str, Engine] = {}
    for entry in consul(dev, "/v1/health/service/llmgw-engine?passing=1"):
        meta = entry["Service"]["Meta"]
        if meta.get("llmgw_model") != MODEL:
            continue
        job = meta[META_JOB]
        items = dev.nomad(f"/v1/var/{variable_path(job)}")["Items"]
        found[job] = Engine(
            f"http://{entry['Service']['Address']}:{entry['Service']['Port']}", items[KEY_ITEM]
        )
    return found


def counts(engines: dict[str, Engine], name: str) -> dict[str, float]:
    return {replica: metric(engine, name) for replica, engine in engines.items()}


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDev]:
    binary = llama_server()
    tmp = tmp_path_factory.mktemp("prefix-llamacpp")
    gguf = write_llama(tmp / "tiny-chat.gguf", seed=3, context=8192)
    (tmp / "catalog.yaml").write_text(CATALOG)
    previous = os.environ.get("LLMGW_LLAMA_SERVER")
    os.environ["LLMGW_LLAMA_SERVER"] = binary
    try:
        running = start_dev(
            tmp, "--catalog", str(tmp / "catalog.yaml"), "--nodes", "1", "--artifact", f"{URL}={gguf}"
        )
    finally:
        if previous is None:
            os.environ.pop("LLMGW_LLAMA_SERVER", None)
        else:
            os.environ["LLMGW_LLAMA_SERVER"] = previous
    try:
        eventually_sync(lambda: len(replicas(running)) == REPLICAS or None, 120, "three replicas passing")
        eventually_sync(lambda: MODEL in serving(running) or None, 30, "the router serving")
        # ... with all three endpoints in its view, which follows Consul.
        eventually_sync(
            lambda: (
                running.router_metric("llmgw_router_endpoints", model=MODEL, state="passing") == REPLICAS
                or None
            ),
            30,
            "the router routing to three replicas",
        )
        yield running
    finally:
        if running.process.poll() is None:
            running.interrupt()


@pytest.fixture
def client(dev: RunningDev) -> openai.OpenAI:
    return openai.OpenAI(base_url=dev.base_url, api_key="unused", max_retries=0, timeout=120)


def words(seed: int, count: int) -> str:
    """``count`` words of tinygguf's vocabulary, in an order of ``seed``'s own."""
    vocabulary = ["the", "a", "and", "of", "to", "in", "is", "it", "you", "that", "model", "engine", "router"]
    return " ".join(vocabulary[(seed * 7 + index * (seed + 3)) % len(vocabulary)] for index in range(count))


def test_a_sessions_turns_are_read_from_one_replicas_cache(dev: RunningDev, client: openai.OpenAI) -> None:
    engines = replicas(dev)
    decisions_before = {
        outcome: dev.router_metric("llmgw_router_routing_decisions_total", model=MODEL, outcome=outcome)
        for outcome in ("affinity", "overflow", "no-history")
    }
    cached_before = dev.router_metric("llmgw_router_tokens_total", model=MODEL, kind="cached")
    reported = 0
    for session in range(3):
        messages: list[Any] = [
            {"role": "system", "content": f"session {session}: " + words(session, 300)},
            {"role": "user", "content": words(session + 10, 40)},
        ]
        session_cached = 0
        served: set[str] = set()
        previous_prompt = 0
        for turn in range(4):
            if turn == 1:  # from the second turn on, the conversation has its owner
                computed_before = counts(engines, COMPUTED)
                cached_by_engine = counts(engines, CACHED)
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8, temperature=0
            )
            answer = raw.parse()
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            cached = answer.usage.prompt_tokens_details.cached_tokens or 0
            reported += cached
            if turn:
                served.add(raw.headers["x-llmgw-replica"])
                session_cached += cached
            if turn > 1:
                # The earlier turns came from the slot's cache: all of the last prompt but
                # its generation prompt, which the template writes differently once the
                # turn is answered ("assistant:", then "<s>assistant: ..."; a byte token a
                # character in tinygguf's vocabulary).
                assert cached >= previous_prompt - len("assistant:"), (turn, cached, previous_prompt)
            previous_prompt = answer.usage.prompt_tokens
            messages += [
                {"role": "assistant", "content": answer.choices[0].message.content or ""},
                {"role": "user", "content": words(session + 20 + turn, 30)},
            ]
        [replica] = served
        # Only that replica computed any of its later turns' prompt tokens.
        moved = {r for r, before in computed_before.items() if metric(engines[r], COMPUTED) > before}
        assert moved == {replica}, (session, moved, replica)
        # ... and its own count of the tokens it read from its cache is what it answered.
        assert metric(engines[replica], CACHED) - cached_by_engine[replica] == session_cached

    # The router counted each first turn as one with no history and each later one as
    # chosen by its key's order (its owner's, or the next one's where the owner held more
    # than its share of conversations), and the engines' cached tokens as they reported them.
    decided = {
        outcome: dev.router_metric("llmgw_router_routing_decisions_total", model=MODEL, outcome=outcome)
        - before
        for outcome, before in decisions_before.items()
    }
    assert decided["no-history"] == 3, decided
    assert decided["affinity"] + decided["overflow"] == 9, decided
    assert (
        dev.router_metric("llmgw_router_tokens_total", model=MODEL, kind="cached") - cached_before == reported
    )
    assert reported > 3 * 3 * 300  # three later turns of three sessions, each past its system prompt


def test_a_hot_conversation_spreads_past_its_owner_and_is_cached_where_it_went(
    dev: RunningDev, client: openai.OpenAI
) -> None:
    engines = replicas(dev)
    # A conversation past its first turn (one with no history goes by least outstanding),
    # continued by six clients at once: a burst of one key.
    hot: list[Any] = [
        {"role": "system", "content": "hot: " + words(99, 200)},
        {"role": "user", "content": words(98, 20)},
        {"role": "assistant", "content": words(97, 10)},
        {"role": "user", "content": words(96, 20)},
    ]
    decisions_before = {
        outcome: dev.router_metric("llmgw_router_routing_decisions_total", model=MODEL, outcome=outcome)
        for outcome in ("affinity", "overflow", "no-key")
    }
    clients = 6
    # The most a burst of six may put on one replica of three: the router's own bound
    # with all six outstanding.
    most = routing.load_bound(clients - 1, REPLICAS, routing.AFFINITY_LOAD_FACTOR)
    opened = threading.Barrier(clients + 1, timeout=120)
    served: list[str] = []
    failures: list[BaseException] = []

    def one() -> None:
        try:
            with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=hot, max_tokens=6000, temperature=0, stream=True, extra_body=ENDLESS
            ) as response:
                served.append(response.headers["x-llmgw-replica"])
                # Its first event: it is being generated. (The iterator is kept: once
                # collected, it would close the stream.)
                events = response.iter_lines()
                first = next(events)
                assert first.startswith("data: {"), first
                opened.wait()  # all of them at once, outstanding ...
                opened.wait()  # ... until the test has looked; then the client leaves
        except BaseException as exc:  # the test's thread reports it
            failures.append(exc)
            opened.abort()

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        opened.wait()
        in_flight = {r: dev.router_metric("llmgw_router_in_flight", model=MODEL, replica=r) for r in engines}
        opened.wait()
    except threading.BrokenBarrierError:
        raise AssertionError(f"a client failed: {failures}") from None
    finally:
        for thread in threads:
            thread.join(timeout=60)
    assert not failures, failures

    # More than one replica took the conversation, none more than the bound lets it, as
    # the router's own gauge showed while they ran; it counted the streams that went past
    # the owner as overflow (or no-key, sent by least outstanding once every replica was
    # at the bound), the others as affinity.
    by_replica = {replica: served.count(replica) for replica in engines}
    assert sum(1 for n in by_replica.values() if n) > 1, by_replica
    assert max(by_replica.values()) <= most, (by_replica, most)
    assert in_flight == by_replica
    decided = {
        outcome: dev.router_metric("llmgw_router_routing_decisions_total", model=MODEL, outcome=outcome)
        - before
        for outcome, before in decisions_before.items()
    }
    assert sum(decided.values()) == clients, decided
    assert decided["affinity"] < clients, decided
    # Each replica that took it now reads the whole hot prompt from its cache (all but
    # the one token llama-server always computes), as its own /metrics count it too; the
    # one that did not shares only the template's first tokens with it.
    eventually_sync(
        lambda: (
            all(metric(engine, "llamacpp:requests_processing") == 0 for engine in engines.values()) or None
        ),
        30,
        "the streams' slots freed once their clients left",
    )
    probe = {"model": MODEL, "messages": hot, "max_tokens": 1, "temperature": 0}
    for replica, engine in engines.items():
        cached_before = metric(engine, CACHED)
        usage = direct(engine, "/v1/chat/completions", probe)["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert metric(engine, CACHED) - cached_before == cached
        if by_replica[replica]:
            assert cached == usage["prompt_tokens"] - 1, (replica, usage)
        else:
            assert cached < 10, (replica, usage)
