"""Guard policies: a judge screens the conversation first; unsafe or unreadable verdicts
block it before it reaches the model; a judge that is down blocks by default."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.gateway.guard import parse_verdict

from .conftest import Cluster, OpenAIFor, StartRouter, metric_value

MESSAGES: Any = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "how do I bake bread?"},
]


def guard_catalog(on_error: str = "block") -> str:
    return f"""
models:
  guarded:
    roles: [chat]
    profiles: [{{engine: sim}}]
    scaling: {{min: 1, max: 1}}
  open:
    roles: [chat]
    profiles: [{{engine: sim}}]
    scaling: {{min: 1, max: 1}}
  judge:
    roles: [guard]
    profiles: [{{engine: vllm, source: meta-llama/Llama-Guard-3-8B}}]
    scaling: {{min: 1, max: 1}}
guard_policies:
  default:
    judge: judge
    models: [guarded]
    on_error: {on_error}
"""


class FakeJudge:
    """A Llama Guard stand-in: answers every chat completion with ``verdict``."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.seen: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            self.seen.append(body)
            return web.json_response(
                {
                    "id": "chatcmpl-judge",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": self.verdict},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                }
            )

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


@pytest.mark.parametrize(
    ("text", "safe", "categories", "readable"),
    [
        ("safe", True, (), True),
        ("  safe\n", True, (), True),
        ("unsafe\nS1", False, ("S1",), True),
        ("unsafe\nS1,S10", False, ("S1", "S10"), True),
        ("unsafe", False, (), True),
        ("Safe", False, (), False),
        ("safe.", False, (), False),
        ("safe\nS1", False, (), False),
        ("unsafe\nviolence", False, (), False),
        ("alpha beta gamma", False, (), False),  # what a simulated judge says
        ("", False, (), False),
    ],
)
def test_the_verdict_parser_is_strict(
    text: str, safe: bool, categories: tuple[str, ...], readable: bool
) -> None:
    verdict = parse_verdict(text)
    assert (verdict.safe, verdict.categories, verdict.readable) == (safe, categories, readable)


async def _setup(cluster: Cluster, verdict: str | None, on_error: str = "block") -> tuple[FakeJudge, Any]:
    cluster.set_catalog(guard_catalog(on_error))
    judge = FakeJudge(verdict or "safe")
    if verdict is not None:
        await cluster.add_app("judge", judge.app())
    model = await cluster.add_sim("guarded")
    return judge, model


async def test_a_safe_verdict_lets_the_request_through(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    judge, _ = await _setup(cluster, "safe")
    router = await start_router()
    completion = await openai_for(router).chat.completions.create(
        model="guarded", messages=MESSAGES, max_tokens=2
    )
    assert completion.model == "guarded"
    assert judge.seen[0]["model"] == "judge"
    assert judge.seen[0]["stream"] is False
    # Llama Guard's template takes alternating user/assistant turns: system text is screened as the user's.
    assert judge.seen[0]["messages"] == [{"role": "user", "content": "be brief\n\nhow do I bake bread?"}]
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    assert metric_value(text, "llmgw_router_guard_seconds_count", policy="default", verdict="safe") == 1


@pytest.mark.parametrize("verdict", ["unsafe\nS1,S9", "I cannot judge this."])
async def test_unsafe_or_unreadable_verdicts_block_before_the_model(
    cluster: Cluster,
    start_router: StartRouter,
    openai_for: OpenAIFor,
    http: aiohttp.ClientSession,
    verdict: str,
) -> None:
    _, model = await _setup(cluster, verdict, on_error="allow")  # allow is for a judge that is down, not this
    client = openai_for(await start_router())
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="guarded", messages=MESSAGES)
    assert caught.value.code == "content_policy_violation"
    if verdict.startswith("unsafe"):
        assert "S1, S9" in caught.value.message
    assert (await model.stats(http))["requests_total"] == 0  # the model never saw it


async def test_models_outside_the_policy_are_not_screened(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    judge, _ = await _setup(cluster, "unsafe\nS1")
    await cluster.add_sim("open")
    completion = await openai_for(await start_router()).chat.completions.create(
        model="open", messages=MESSAGES, max_tokens=1
    )
    assert completion.model == "open" and judge.seen == []


async def test_a_judge_that_is_down_blocks_by_default(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    _, model = await _setup(cluster, None)  # no judge replica at all
    client = openai_for(await start_router())
    with pytest.raises(openai.APIStatusError) as caught:
        await client.chat.completions.create(model="guarded", messages=MESSAGES)
    assert caught.value.status_code == 503 and caught.value.code == "guard_unavailable"
    assert (await model.stats(http))["requests_total"] == 0


async def test_a_judge_that_is_down_lets_requests_through_with_on_error_allow(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    await _setup(cluster, None, on_error="allow")
    client = openai_for(await start_router())
    completion = await client.chat.completions.create(model="guarded", messages=MESSAGES, max_tokens=1)
    assert completion.model == "guarded"


class ScreeningJudge(FakeJudge):
    """Unsafe whenever the conversation it is shown holds ``word`` anywhere."""

    def __init__(self, word: str) -> None:
        super().__init__("safe")
        self.word = word

    def app(self) -> web.Application:
        inner = super().app()

        @web.middleware
        async def judge(request: web.Request, handler: Any) -> web.StreamResponse:
            body = await request.json()
            self.verdict = "unsafe\nS1" if self.word in json.dumps(body["messages"]) else "safe"
            response: web.StreamResponse = await handler(request)
            return response

        inner.middlewares.append(judge)
        return inner


class RecordingEngine:
    """A chat engine that keeps the bytes it was sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            self.bodies.append(await request.read())
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "guarded",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/completions", chat)
        return app


async def _screening(cluster: Cluster) -> RecordingEngine:
    cluster.set_catalog(
        guard_catalog().replace(
            "roles: [chat]\n    profiles: [{engine: sim}]",
            "roles: [chat, completion]\n    profiles: [{engine: sim}]",
            1,
        )
    )
    await cluster.add_app("judge", ScreeningJudge("EVIL").app())
    engine = RecordingEngine()
    await cluster.add_app("guarded", engine.app())
    return engine


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}, {"role": "tool", "content": "EVIL", "tool_call_id": "1"}],
        [{"role": "assistant", "content": "EVIL"}, {"role": "user", "content": "go on"}],
        [{"role": "ipython", "content": "EVIL"}],
    ],
)
async def test_text_in_any_role_is_screened(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, messages: Any
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    body = {"model": "guarded", "messages": messages}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "content_policy_violation"
    assert engine.bodies == []


_TOOL = {"type": "function", "function": {"name": "lookup", "description": "EVIL", "parameters": {}}}


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        # Chat templates render tool definitions, documents and template variables
        # into the prompt, and earlier turns' reasoning: the model reads them.
        ("/v1/chat/completions", {"tools": [_TOOL]}),
        ("/v1/chat/completions", {"functions": [{"name": "EVIL", "parameters": {}}]}),
        ("/v1/chat/completions", {"documents": [{"title": "t", "text": "EVIL"}]}),
        ("/v1/chat/completions", {"chat_template_kwargs": {"system_prompt": "EVIL"}}),
        ("/v1/chat/completions", {"reasoning_effort": "EVIL"}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "assistant", "content": "", "reasoning_content": "EVIL"}]},
        ),
        ("/v1/completions", {"prompt": "hi", "suffix": "EVIL"}),
    ],
)
async def test_text_the_model_reads_beside_the_messages_is_screened(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, path: str, extra: Any
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    body = {"model": "guarded", "messages": [{"role": "user", "content": "hi"}], **extra}
    async with http.post(router.url + path, json=body) as response:
        assert response.status == 400, await response.text()
        assert (await response.json())["error"]["code"] == "content_policy_violation"
    assert engine.bodies == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # vLLM 0.10.2 renders either unconditionally: the template, not the screened
        # messages, decides the prompt (this one writes text the judge never read).
        ({"chat_template": "{{ 'EV' ~ 'IL' }}"}, "chat_template"),
        ({"chat_template_kwargs": {"chat_template": "{{ 'EV' ~ 'IL' }}"}}, "chat_template_kwargs"),
        ({"chat_template": ""}, "chat_template"),
        # SGLang 0.5.3 passes the kwargs to apply_chat_template: these cut the screened prompt.
        ({"chat_template_kwargs": {"truncation": True, "max_length": 4}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tokenizer_kwargs": {"truncation": True}}}, "chat_template_kwargs"),
    ],
)
async def test_a_chat_template_sent_to_a_guarded_model_is_refused(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, extra: Any, param: str
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    body = {"model": "guarded", "messages": [{"role": "user", "content": "hi"}], **extra}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 400, await response.text()
        error = (await response.json())["error"]
    assert error["param"] == param and "leave out" in error["message"]
    assert engine.bodies == []


async def test_template_variables_still_reach_a_guarded_model_once_screened(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    body = {
        "model": "guarded",
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False, "chat_template": None, "truncation": False},
    }
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
    [sent] = engine.bodies
    assert json.loads(sent)["chat_template_kwargs"] == {
        "enable_thinking": False,
        "chat_template": None,
        "truncation": False,
    }


async def test_the_engine_gets_what_the_judge_read_not_the_clients_bytes(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    # Two "messages" keys: Python keeps the last; a parser that keeps the first would
    # hand the model a conversation the judge never saw.
    raw = (
        b'{"model":"guarded","messages":[{"role":"user","content":"EVIL"}],'
        b'"messages":[{"role":"user","content":"benign"}]}'
    )
    headers = {"Content-Type": "application/json"}
    async with http.post(router.url + "/v1/chat/completions", data=raw, headers=headers) as response:
        assert response.status == 200
    [sent] = engine.bodies
    assert b"EVIL" not in sent and json.loads(sent)["messages"] == [{"role": "user", "content": "benign"}]


async def test_a_token_id_prompt_to_a_guarded_model_is_refused(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    body = {"model": "guarded", "prompt": [9906, 1917]}
    async with http.post(router.url + "/v1/completions", json=body) as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["param"] == "prompt" and "token ids" in error["message"]
    assert engine.bodies == []


IMAGE = {"url": "data:image/png;base64,iVBORw0KGgo="}  # an image could say what the text screen blocks
WITH_IMAGE: Any = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "do what it says"}, {"type": "image_url", "image_url": IMAGE}],
    }
]


async def test_an_image_for_a_guarded_model_is_refused_when_its_judge_reads_text_only(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    engine = await _screening(cluster)
    client = openai_for(await start_router())
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="guarded", messages=WITH_IMAGE)
    assert (
        caught.value.param == "messages"
        and "cannot screen a `image_url` content part" in caught.value.message
    )
    assert engine.bodies == []  # the model never saw it


async def test_a_judge_that_reads_images_screens_them_with_the_text(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor
) -> None:
    cluster.set_catalog(guard_catalog() + "    judge_reads_images: true\n")
    judge = FakeJudge("safe")
    await cluster.add_app("judge", judge.app())
    engine = RecordingEngine()
    await cluster.add_app("guarded", engine.app())
    client = openai_for(await start_router())
    await client.chat.completions.create(model="guarded", messages=WITH_IMAGE)
    [screened] = judge.seen
    assert screened["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "do what it says"},
                {"type": "image_url", "image_url": IMAGE},
            ],
        }
    ]
    [sent] = engine.bodies
    assert json.loads(sent)["messages"] == WITH_IMAGE

    judge.verdict = "unsafe\nS1"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="guarded", messages=WITH_IMAGE)
    assert caught.value.code == "content_policy_violation"
    assert len(engine.bodies) == 1


# --- a judge's refusal of what the client sent is a verdict, not an outage ---------------------


def _padded(words: int) -> Any:
    return [{"role": "user", "content": "how do I bake bread? " + "please " * words}]


async def test_padding_past_the_judges_context_does_not_turn_the_screen_off(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    # The attack: a simulated judge blocks everything, and a prompt padded past its
    # context made it answer vLLM's 400, which on_error: allow used to let through.
    cluster.set_catalog(guard_catalog(on_error="allow"))
    await cluster.add_sim("judge", max_model_len=64)
    model = await cluster.add_sim("guarded")
    client = openai_for(await start_router())
    with pytest.raises(openai.BadRequestError) as short:
        await client.chat.completions.create(model="guarded", messages=_padded(0))
    assert short.value.code == "content_policy_violation"
    with pytest.raises(openai.BadRequestError) as padded:
        await client.chat.completions.create(model="guarded", messages=_padded(100))
    assert padded.value.code == "context_length_exceeded" and padded.value.param == "messages"
    assert "shorten the conversation" in padded.value.message
    assert (await model.stats(http))["requests_total"] == 0


class AnsweringJudge:
    """A judge engine that answers every call with ``status`` and ``body``."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body
        self.calls = 0

    def app(self) -> web.Application:
        async def chat(request: web.Request) -> web.Response:
            self.calls += 1
            return web.json_response(self.body, status=self.status)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


def _vllm_error(message: str) -> Any:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


@pytest.mark.parametrize(
    ("status", "body", "answer", "code"),
    [
        # vLLM on an image whose tokens overflow its context (vllm/v1/engine/processor.py).
        (
            400,
            _vllm_error(
                "The decoder prompt (length 9000) is longer than the maximum model length of 8192. "
                "Make sure that `max_model_len` is no smaller than the number of text tokens plus "
                "multimodal tokens."
            ),
            400,
            "context_length_exceeded",
        ),
        # llama.cpp's server.
        (
            400,
            {
                "error": {
                    "code": 400,
                    "type": "exceed_context_size_error",
                    "message": "request exceeds the available context size (8192 tokens), try increasing it",
                }
            },
            400,
            "context_length_exceeded",
        ),
        # Any other refusal of what the client sent (an image it cannot decode).
        (400, _vllm_error("cannot identify image file"), 400, "content_policy_violation"),
        (422, {"detail": "unprocessable"}, 400, "content_policy_violation"),
        # The judge failing is unavailability: on_error says, here allow.
        (500, _vllm_error("engine crashed"), 200, None),
        (503, _vllm_error("overloaded"), 200, None),
    ],
)
async def test_a_judges_4xx_blocks_and_only_its_5xx_is_unavailable(
    cluster: Cluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
    status: int,
    body: Any,
    answer: int,
    code: str | None,
) -> None:
    cluster.set_catalog(guard_catalog(on_error="allow") + "    judge_reads_images: true\n")
    judge = AnsweringJudge(status, body)
    await cluster.add_app("judge", judge.app())
    engine = RecordingEngine()
    await cluster.add_app("guarded", engine.app())
    router = await start_router()
    request = {"model": "guarded", "messages": WITH_IMAGE}
    async with http.post(router.url + "/v1/chat/completions", json=request) as response:
        assert response.status == answer, await response.text()
        if code is not None:
            assert (await response.json())["error"]["code"] == code
    assert len(engine.bodies) == (1 if answer == 200 else 0)
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    reading = {"context_length_exceeded": "too_long", "content_policy_violation": "refused"}.get(
        code or "", "error"
    )
    assert metric_value(text, "llmgw_router_guard_seconds_count", policy="default", verdict=reading) >= 1


class ShortContextJudge(FakeJudge):
    """Reads at most ``limit`` characters of conversation (vLLM's 400 past them), and
    is unsafe on any piece holding ``word``."""

    def __init__(self, limit: int, word: str = "EVIL") -> None:
        super().__init__("safe")
        self.limit, self.word = limit, word

    def app(self) -> web.Application:
        inner = super().app()

        @web.middleware
        async def judge(request: web.Request, handler: Any) -> web.StreamResponse:
            body = await request.json()
            text = "".join(str(m["content"]) for m in body["messages"])
            if len(text) > self.limit:
                self.seen.append(body)
                return web.json_response(
                    _vllm_error(
                        f"This model's maximum context length is {self.limit} tokens. However, your "
                        f"request has {len(text)} input tokens. Please reduce the length of the input "
                        "messages."
                    ),
                    status=400,
                )
            self.verdict = "unsafe\nS1" if self.word in text else "safe"
            response: web.StreamResponse = await handler(request)
            return response

        inner.middlewares.append(judge)
        return inner


def _long_text(evil_at: int | None) -> str:
    words = [f"word{i}" for i in range(200)]
    if evil_at is not None:
        words[evil_at] = "EVIL"
    return " ".join(words)


async def _split_setup(cluster: Cluster, policy_lines: str) -> tuple[ShortContextJudge, RecordingEngine]:
    cluster.set_catalog(guard_catalog() + policy_lines)
    judge = ShortContextJudge(limit=400)
    await cluster.add_app("judge", judge.app())
    engine = RecordingEngine()
    await cluster.add_app("guarded", engine.app())
    return judge, engine


async def test_on_too_long_split_judges_every_piece_of_a_long_conversation(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    judge, engine = await _split_setup(cluster, "    on_too_long: split\n")
    router = await start_router()
    url = router.url + "/v1/chat/completions"
    text = _long_text(None)  # ~1,400 characters: four pieces or so
    async with http.post(
        url, json={"model": "guarded", "messages": [{"role": "user", "content": text}]}
    ) as r:
        assert r.status == 200, await r.text()
    read = [m["content"] for body in judge.seen for m in body["messages"] if len(str(m["content"])) <= 400]
    assert len(read) > 2 and all(f"word{i}" in "".join(read) for i in range(200))  # nothing skipped
    for evil_at in (0, 99, 100, 199):  # at the start, the end, and where a cut falls
        messages = [{"role": "user", "content": _long_text(evil_at)}]
        async with http.post(url, json={"model": "guarded", "messages": messages}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "content_policy_violation"
    assert len(engine.bodies) == 1


@pytest.mark.parametrize(
    ("policy_lines", "max_pieces", "calls"),
    [
        ("", 16, 1),  # block is the default
        ("    on_too_long: block\n", 16, 1),
        # The whole, then its first half: still too long, and two more pieces would be 4 calls.
        ("    on_too_long: split\n", 3, 2),
    ],
)
async def test_a_conversation_too_long_for_the_judge_is_blocked(
    cluster: Cluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
    policy_lines: str,
    max_pieces: int,
    calls: int,
) -> None:
    judge, engine = await _split_setup(cluster, policy_lines)
    router = await start_router(guard_max_pieces=max_pieces)
    body = {"model": "guarded", "messages": [{"role": "user", "content": _long_text(None)}]}
    async with http.post(router.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "context_length_exceeded"
    assert len(judge.seen) == calls and engine.bodies == []


# --- every field a chat template renders is screened ------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "", "name": "EVIL"}],
        [{"role": "user", "content": None, "name": "EVIL"}],
        [{"role": "EVIL", "content": ""}],  # Llama 3.1's template writes the role as it is
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "EVIL", "arguments": "{}"}}
                ],
            },
        ],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "function_call": {"name": "EVIL", "arguments": "{}"}},
        ],
        [{"role": "tool", "content": "", "tool_call_id": "EVIL"}],
    ],
)
async def test_names_and_tool_calls_are_screened_even_with_no_content(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, messages: Any
) -> None:
    engine = await _screening(cluster)
    router = await start_router()
    async with http.post(
        router.url + "/v1/chat/completions", json={"model": "guarded", "messages": messages}
    ) as response:
        assert response.status == 400, await response.text()
        assert (await response.json())["error"]["code"] == "content_policy_violation"
    assert engine.bodies == []


async def test_a_request_whose_only_text_is_a_name_goes_to_the_judge(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    # The attack as filed: empty content, a name, and a judge that blocks everything.
    _, model = await _setup(cluster, "unsafe\nS1")
    router = await start_router()
    messages = [{"role": "user", "content": "", "name": "explain_how_to_build_a_weapon"}]
    async with http.post(
        router.url + "/v1/chat/completions", json={"model": "guarded", "messages": messages}
    ) as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "content_policy_violation"
    assert (await model.stats(http))["requests_total"] == 0


async def test_a_lone_surrogate_to_a_guarded_model_is_openais_400(
    cluster: Cluster, start_router: StartRouter, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    judge, model = await _setup(cluster, "safe")
    router = await start_router()
    raw = b'{"model": "guarded", "messages": [{"role": "user", "content": "\\ud800"}]}'
    with caplog.at_level(logging.INFO, logger="llmgw"):
        async with http.post(
            router.url + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error" and "could not parse the JSON body" in error["message"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert judge.seen == [] and (await model.stats(http))["requests_total"] == 0


async def test_a_sim_judge_lets_normal_prompts_through_and_blocks_its_phrase(
    cluster: Cluster, start_router: StartRouter, openai_for: OpenAIFor, http: aiohttp.ClientSession
) -> None:
    # The example catalog's guard demo: `llmgw sim --judge-unsafe-phrase` as the judge.
    cluster.set_catalog(guard_catalog())
    await cluster.add_sim("judge", judge_unsafe_phrase="forbidden fruit")
    model = await cluster.add_sim("guarded")
    client = openai_for(await start_router())
    completion = await client.chat.completions.create(model="guarded", messages=MESSAGES, max_tokens=3)
    assert completion.model == "guarded" and completion.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="guarded", messages=[{"role": "user", "content": "where is the Forbidden Fruit?"}]
        )
    assert caught.value.code == "content_policy_violation"
    assert (await model.stats(http))["requests_total"] == 1  # the blocked one never reached it


def _listed_guards_catalog(on_error: str) -> str:
    return (
        guard_catalog(on_error)
        + """
fallbacks:
  front: [guarded]
aliases:
  guarded-alias: guarded
"""
    ).replace(
        "models:\n",
        "models:\n  front:\n    roles: [chat]\n    profiles: [{engine: sim}]\n"
        "    scaling: {min: 1, max: 1}\n",
        1,
    )


@pytest.mark.parametrize(
    ("judge_serves", "on_error", "available"),
    [
        pytest.param(True, "block", True, id="the judge serves"),
        pytest.param(False, "block", False, id="no judge replica: 503 guard_unavailable"),
        pytest.param(False, "allow", True, id="no judge replica, on_error allow: let through"),
    ],
)
async def test_the_model_list_says_whether_a_models_guard_answers(
    cluster: Cluster,
    start_router: StartRouter,
    openai_for: OpenAIFor,
    http: aiohttp.ClientSession,
    judge_serves: bool,
    on_error: str,
    available: bool,
) -> None:
    cluster.set_catalog(_listed_guards_catalog(on_error))
    if judge_serves:
        await cluster.add_sim("judge", judge_unsafe_phrase="forbidden fruit")
    for name in ("guarded", "open", "front"):
        await cluster.add_sim(name)
    router = await start_router()
    async with http.get(router.url + "/v1/models") as response:
        listed = {m["id"]: m["llmgw"] for m in (await response.json())["data"]}
    judge_state = "serving" if judge_serves else "no-capacity"
    expected = {
        "available": available,
        "judges": [{"policy": "default", "model": "judge", "state": judge_state, "on_error": on_error}],
    }
    assert listed["guarded"]["guard"] == expected
    assert listed["guarded-alias"]["guard"] == expected
    assert listed["front"]["guard"] == expected  # its fallback is screened: so is it
    assert listed["open"]["guard"] is None
    assert listed["guarded"]["state"] == "serving"  # the model's own state is unchanged
    # What the list says is what a request gets.
    client = openai_for(router)
    if available:
        assert (await client.chat.completions.create(model="front", messages=MESSAGES, max_tokens=1)).model
    else:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="front", messages=MESSAGES)
        assert caught.value.code == "guard_unavailable"
