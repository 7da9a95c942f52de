"""The router's pure helpers as tables: settings precedence, key parsing and rate limits
on a synthetic clock, usage found at the end of answers, the judge's conversation."""

from __future__ import annotations

import argparse
import json

import pytest

from llmgw.core.addresses import is_loopback
from llmgw.core.routing import Api
from llmgw.gateway import errors
from llmgw.gateway.calls import ApiCall, parse_call
from llmgw.gateway.errors import ApiError
from llmgw.gateway.guard import Turn, judge_messages, says_too_long, split_in_two
from llmgw.gateway.keys import KeyRing, RateLimiter, authenticate, key_id_of, masked, new_api_key
from llmgw.gateway.settings import RouterSettings, RouterSettingsError, add_router_arguments
from llmgw.gateway.upstream import token_counts, usage_of_body, usage_of_stream_tail


def test_flags_win_over_env_which_wins_over_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_router_arguments(parser)
    namespace = parser.parse_args(["--port", "9000", "--no-auth"])
    env = {"LLMGW_ROUTER_PORT": "7000", "LLMGW_ROUTER_LOAD_WAIT": "2.5", "LLMGW_ROUTER_ACCESS_LOG": "true"}
    settings = RouterSettings.from_env_and_args(env, namespace)
    assert (settings.port, settings.load_wait, settings.access_log, settings.no_auth) == (
        9000,
        2.5,
        True,
        True,
    )
    assert settings.upstream_idle_timeout == RouterSettings().upstream_idle_timeout
    names = parser.parse_args(["--allowed-hosts", "Prometheus.internal, ,router.lan"])
    assert RouterSettings.from_env_and_args({}, names).allowed_hosts == ("prometheus.internal", "router.lan")
    assert RouterSettings().allowed_hosts == ()


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"LLMGW_ROUTER_PORT": "x"}, "LLMGW_ROUTER_PORT"),
        ({"LLMGW_ROUTER_UPSTREAM_IDLE_TIMEOUT": "0"}, "--upstream-idle-timeout must be > 0"),
        ({"LLMGW_ROUTER_NO_AUTH": "yes", "LLMGW_ROUTER_HOST": "0.0.0.0"}, "loopback"),
        ({"LLMGW_ROUTER_BACKLOG": "0"}, "--backlog"),
        ({"LLMGW_ROUTER_ALLOWED_HOSTS": "prometheus.internal:9090"}, "--allowed-hosts .* bare host name"),
        ({"LLMGW_ROUTER_ALLOWED_HOSTS": "http://prometheus.internal"}, "--allowed-hosts"),
    ],
)
def test_bad_settings_name_what_to_fix(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(RouterSettingsError, match=fragment):
        RouterSettings.from_env_and_args(env)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("10.1.2.3", False)],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_keys_carry_their_id_and_are_never_shown_whole() -> None:
    issued = new_api_key("team", now=1.0, token_bytes=lambda n: bytes(range(n)))
    assert key_id_of(issued.key) == issued.record.key_id == "k-0001020304050607"
    assert masked(issued.key) == "sk-llmgw-k-0001020304050607.****"
    ring = KeyRing({issued.record.key_id: issued.record})
    assert authenticate(f"Bearer {issued.key}", ring) == issued.record
    for header in (None, "", "Basic abc", "Bearer "):
        with pytest.raises(errors.ApiError) as caught:
            authenticate(header, ring)
        assert caught.value.refusal.status == 401 and caught.value.refusal.code is None
    with pytest.raises(errors.ApiError) as caught:
        authenticate(f"Bearer {issued.key[:-1]}A", ring)
    assert caught.value.refusal.code == "invalid_api_key"


def test_rate_limits_refill_over_a_minute() -> None:
    record = new_api_key("t", now=0.0, requests_per_minute=2, tokens_per_minute=100).record
    limiter = RateLimiter()
    limiter.admit(record, now=0.0)
    limiter.admit(record, now=0.0)
    with pytest.raises(errors.ApiError) as caught:
        limiter.admit(record, now=1.0)
    assert caught.value.refusal.retry_after == 29  # half a minute refills one request; one second passed
    hold = limiter.admit(record, now=30.0, tokens=10)
    assert hold is not None
    hold.settle(150)  # used more than it held: the budget goes below zero, the next request waits
    with pytest.raises(errors.ApiError) as caught:
        limiter.admit(record, now=31.0)
    assert caught.value.refusal.type == "tokens"
    limiter.admit(record, now=90.0)


def test_a_token_hold_is_taken_at_admission_and_settled_once() -> None:
    record = new_api_key("t", now=0.0, tokens_per_minute=1000).record
    limiter = RateLimiter()
    first = limiter.admit(record, now=0.0, tokens=400)
    second = limiter.admit(record, now=0.0, tokens=400)
    assert first is not None and second is not None and first.held == 400
    with pytest.raises(errors.ApiError) as caught:  # 200 left, 400 wanted
        limiter.admit(record, now=0.0, tokens=400)
    refusal = caught.value.refusal
    assert refusal.type == "tokens" and "Limit 1000, Requested 400" in refusal.message
    assert refusal.retry_after == 12  # 200 more tokens at 1000 a minute
    first.settle(50)  # 350 back
    first.settle(0)  # a second settlement changes nothing
    first.release()
    assert not first.open
    third = limiter.admit(record, now=0.0, tokens=400)
    assert third is not None
    third.keep()  # a client that left mid-stream pays the whole hold
    second.release()
    with pytest.raises(errors.ApiError):  # 1000 - 50 - 400 = 550 left
        limiter.admit(record, now=0.0, tokens=600)
    assert limiter.admit(record, now=0.0, tokens=550) is not None


def test_a_hold_larger_than_the_limit_waits_for_a_full_budget() -> None:
    record = new_api_key("t", now=0.0, tokens_per_minute=100).record
    limiter = RateLimiter()
    big = limiter.admit(record, now=0.0, tokens=10_000)
    assert big is not None and big.held == 100  # never more than the limit, so it can fit
    with pytest.raises(errors.ApiError):
        limiter.admit(record, now=0.0, tokens=1)
    big.settle(30)
    assert limiter.admit(record, now=0.0, tokens=70) is not None
    refund = limiter.admit(record, now=60.0, tokens=10_000)
    assert refund is not None
    refund.release()
    assert limiter.admit(record, now=60.0, tokens=100) is not None  # a release never overfills


def test_a_refused_request_holds_nothing_and_keys_without_a_token_limit_hold_nothing() -> None:
    both = new_api_key("t", now=0.0, requests_per_minute=1, tokens_per_minute=100).record
    limiter = RateLimiter()
    limiter.admit(both, now=0.0, tokens=10)
    with pytest.raises(errors.ApiError) as caught:
        limiter.admit(both, now=0.0, tokens=10)
    assert caught.value.refusal.type == "requests"
    assert limiter.admit(both, now=60.0, tokens=90) is not None  # the refused one took no tokens
    assert limiter.admit(new_api_key("u", now=0.0).record, now=0.0, tokens=10**9) is None


def test_the_tokens_a_request_holds() -> None:
    chat = parse_call(Api.CHAT, b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}')
    prompt = -(-chat.size // 4)
    assert chat.tokens_to_hold(1024) == prompt + 100
    newer = parse_call(
        Api.CHAT,
        b'{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":9,"max_completion_tokens":50,"n":3}',
    )
    assert newer.tokens_to_hold(1024) == -(-newer.size // 4) + 150
    unbounded = parse_call(Api.COMPLETIONS, b'{"model":"m","prompt":"' + b"x" * 4000 + b'"}')
    assert unbounded.tokens_to_hold(1024) == -(-unbounded.size // 4) + 1024 > 2000
    negative = parse_call(Api.COMPLETIONS, b'{"model":"m","prompt":"x","max_tokens":-5,"n":-2}')
    assert negative.tokens_to_hold(1024) == -(-negative.size // 4)
    embedding = parse_call(Api.EMBEDDINGS, b'{"model":"m","input":"hello","max_tokens":1000}')
    assert embedding.tokens_to_hold(1024) == -(-embedding.size // 4)

    # Anthropic's Messages API has neither max_completion_tokens nor n: the engine writes
    # max_tokens whatever they say, so they cannot shrink what a key holds.
    message = parse_call(
        Api.MESSAGES,
        b'{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":150,'
        b'"max_completion_tokens":1,"n":0}',
    )
    assert message.tokens_to_hold(1024) == -(-message.size // 4) + 150


def test_usage_is_found_at_the_end_of_answers() -> None:
    body = (
        b'{"id":"x","choices":[{"message":{"content":"say \\"usage\\": {}"}}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":5}}'
    )
    assert usage_of_body(body) == {"prompt_tokens": 3, "completion_tokens": 5}
    assert usage_of_body(b'{"data":[]}') is None
    tail = (
        b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert usage_of_stream_tail(tail) == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert usage_of_stream_tail(tail[30:70]) is None  # a cut event is skipped, not misread
    assert token_counts({"prompt_tokens": 3, "completion_tokens": True}) == (3, 0)
    assert token_counts(None) == (0, 0)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"\\uDFFF tail"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"\\ud9ab":1}',  # a key
        b'{"model":"m","messages":[{"role":"user","content":"\xed\xbf\xbf"}]}',  # a surrogate's bytes
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"\xed\xa0\x80":1}',  # in a key, no \u
        b'{"model":"m","messages":[{"role":"user","content":"caf\xc3\xa9 \\ud800"}]}',  # beside other text
        '{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}'.encode("utf-16"),
    ],
)
def test_a_lone_surrogate_is_refused_as_unparsable_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        parse_call(Api.CHAT, raw)
    assert caught.value.refusal.status == 400 and "could not parse the JSON" in caught.value.refusal.message


@pytest.mark.parametrize(
    ("api", "raw", "message", "param"),
    [
        (Api.COMPLETIONS, b'{"model":"m"}', "you must provide a prompt parameter", "prompt"),
        (Api.EMBEDDINGS, b'{"model":"m","input":null}', "you must provide an input parameter", "input"),
        (
            Api.COMPLETIONS,
            b'{"model":"m","prompt":{"text":"hi"}}',
            """{"text": "hi"} is not valid under any of the given schemas - 'prompt'""",
            "prompt",
        ),
        (
            Api.EMBEDDINGS,
            b'{"model":"m","input":7}',
            "7 is not valid under any of the given schemas - 'input'",
            "input",
        ),
    ],
)
def test_a_prompt_or_input_missing_or_of_no_accepted_type_is_refused_in_openais_words(
    api: Api, raw: bytes, message: str, param: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_call(api, raw)
    refusal = caught.value.refusal
    assert (refusal.status, refusal.message, refusal.param) == (400, message, param)


def test_surrogate_pairs_and_escaped_backslashes_are_text() -> None:
    pair = parse_call(Api.CHAT, b'{"model":"m","messages":[{"role":"user","content":"\\ud83d\\ude00"}]}')
    assert pair.raw is not None and pair.upstream_body("other", force_usage=False)
    slashes = parse_call(Api.CHAT, b'{"model":"m","messages":[{"role":"user","content":"\\\\ud800"}]}')
    assert slashes.body["messages"] == [{"role": "user", "content": "\\ud800"}]


def _chat(messages: object) -> ApiCall:
    return parse_call(Api.CHAT, ('{"model":"m","messages":' + json.dumps(messages) + "}").encode())


def test_the_judge_sees_alternating_text_turns_from_the_user() -> None:
    call = _chat(
        [
            {"role": "assistant", "content": "first: screened as the user's"},
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, "and"]},
            {"role": "tool", "content": "a tool result the client wrote", "tool_call_id": "1"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"role": "user", "content": "then"},
        ]
    )
    assert judge_messages(call) == [
        {
            "role": "user",
            # The tool message's tool_call_id is text a template may write too.
            "content": (
                "first: screened as the user's\n\nsys\n\nlook\nand\n\na tool result the client wrote\n1"
            ),
        },
        {"role": "assistant", "content": "no"},
        {"role": "user", "content": "then"},
    ]
    completion = parse_call(Api.COMPLETIONS, b'{"model":"m","prompt":["a","b"]}')
    assert judge_messages(completion) == [{"role": "user", "content": "a\nb"}]


IMAGE = {"url": "data:image/png;base64,iVBORw0KGgo="}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": IMAGE},
        {"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}},
        {"type": "file", "file": {"file_data": "JVBERi0"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
        {"type": "text", "text": 5},  # not text after all
        {"image_url": IMAGE},  # no type: not readable as text
        ["nested"],
    ],
)
def test_content_the_judge_cannot_read_is_refused_not_dropped(part: object) -> None:
    # An image (or audio, a file...) can carry the words the text screen would block:
    # dropping it from the screen and sending it on would let it past the guard.
    call = _chat([{"role": "user", "content": [{"type": "text", "text": "read this"}, part]}])
    with pytest.raises(ApiError) as caught:
        judge_messages(call)
    assert caught.value.refusal.status == 400 and caught.value.refusal.param == "messages"
    assert "cannot screen" in caught.value.refusal.message


@pytest.mark.parametrize("content", [{"type": "text", "text": "EVIL"}, 5, True])
def test_content_that_is_neither_text_nor_parts_is_refused(content: object) -> None:
    call = _chat([{"role": "user", "content": content}])  # the router passes it on unscreened
    with pytest.raises(ApiError) as caught:
        judge_messages(call)
    assert caught.value.refusal.param == "messages"


def test_a_judge_that_reads_images_gets_them_beside_the_text() -> None:
    call = _chat(
        [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": IMAGE},
                ],
            },
            {"role": "assistant", "content": "a cat"},
            {"role": "user", "content": [{"type": "image_url", "image_url": IMAGE}]},
        ]
    )
    assert judge_messages(call, images=True) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "sys\n\nwhat is this"},
                {"type": "image_url", "image_url": IMAGE},
            ],
        },
        {"role": "assistant", "content": "a cat"},
        {"role": "user", "content": [{"type": "image_url", "image_url": IMAGE}]},
    ]
    audio = _chat([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}])
    with pytest.raises(ApiError):
        judge_messages(audio, images=True)  # images only


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "tool", "content": "HIDDEN", "tool_call_id": "1"}],
        [{"role": "function", "name": "f", "content": "HIDDEN"}],
        [{"role": "ipython", "content": "HIDDEN"}],  # a role the template renders as it is
        [{"role": "User", "content": "HIDDEN"}],
        [{"role": "assistant", "content": "HIDDEN"}, {"role": "user", "content": "hi"}],
        [{"role": "assistant", "content": "HIDDEN"}],
        [{"role": "user", "content": [{"type": "text", "text": "HIDDEN"}]}],
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": "HIDDEN"}}
                ],
            },
        ],
    ],
)
def test_no_message_the_model_reads_escapes_the_judge(messages: object) -> None:
    screened = judge_messages(_chat(messages))
    assert any("HIDDEN" in turn["content"] for turn in screened), screened
    assert screened[0]["role"] == "user"


def test_the_fields_templates_render_beside_the_content_are_screened() -> None:
    call = _chat(
        [
            {"role": "narrator", "content": "", "name": "alice"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call-9",
                        "type": "function",
                        "function": {"name": "search", "arguments": {"q": "x"}},
                    }
                ],
            },
            {"role": "tool", "content": "", "tool_call_id": "call-9", "name": "search"},
            {"role": "assistant", "function_call": {"name": "legacy", "arguments": "{}"}},
            {"role": "developer", "content": "", "tools": [{"name": "dev_tool"}], "task": "a task"},
        ]
    )
    assert judge_messages(call) == [
        {"role": "user", "content": "narrator\nalice"},
        {"role": "assistant", "content": "call-9\nsearch\nq\nx"},
        {"role": "user", "content": "search\ncall-9"},
        {"role": "assistant", "content": "legacy\n{}"},
        {"role": "user", "content": "a task\nname\ndev_tool"},
    ]
    empty = _chat([{"role": "user", "content": ""}, {"role": "assistant", "content": None}])
    assert judge_messages(empty) == []  # no text at all: nothing to screen


def _turns(*texts: str) -> list[Turn]:
    return [Turn("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(texts)]


def test_a_conversation_too_long_for_its_judge_splits_between_turns_then_within_one() -> None:
    halves = split_in_two(_turns("a", "b", "c"))
    assert halves == ([Turn("user", "a")], [Turn("user", "b\n\nc")])  # each piece starts with the user
    text = " ".join(f"w{i:03d}" for i in range(100))  # 499 characters
    first, second = split_in_two([Turn("user", text)]) or ([], [])
    [head], [tail] = first, second
    assert text.startswith(head.text) and text.endswith(tail.text)
    assert max(len(head.text), len(tail.text)) <= len(text) * 5 // 8  # smaller each time
    overlap = len(head.text) + len(tail.text) - len(text)
    assert overlap >= 2 * (len(text) // 16)  # words at the cut are read whole in one piece
    image = {"url": "data:image/png;base64,iVBORw0KGgo="}
    with_images = [Turn("user", "look", (image, image))]
    assert split_in_two(with_images) == ([Turn("user", "", (image, image))], [Turn("user", "look")])
    assert split_in_two([Turn("user", "", (image, image))]) == (
        [Turn("user", "", (image,))],
        [Turn("user", "", (image,))],
    )
    assert split_in_two([Turn("user", "", (image,))]) is None  # one image: nothing smaller
    assert split_in_two([Turn("user", "short text")]) is None


@pytest.mark.parametrize(
    ("status", "body", "too_long"),
    [
        # vLLM (its envelope: type BadRequestError, code the status), prompt alone and with max_tokens.
        (400, {"error": {"message": "This model's maximum context length is 64 tokens. However, your "
                         "request has 80 input tokens.", "type": "BadRequestError", "code": 400}}, True),
        # vLLM with images; older vLLM put the fields at the top level.
        (400, {"object": "error", "message": "The decoder prompt (length 9000) is longer than the maximum "
               "model length of 8192.", "type": "BadRequestError", "code": 400}, True),
        (400, {"error": {"message": "Requested token count exceeds the model's maximum context length "
                         "of 4096 tokens."}}, True),  # SGLang
        # llama.cpp
        (400, {"error": {"type": "exceed_context_size_error", "message": "request too big"}}, True),
        (400, {"error": {"code": "context_length_exceeded", "message": "too long"}}, True),  # OpenAI
        (413, "payload too large", True),
        (400, {"error": {"message": "cannot identify image file"}}, False),
        (400, "not json", False),
        (500, {"error": {"message": "maximum context length"}}, False),  # a 5xx is never the client's
    ],
)  # fmt: skip
def test_an_engines_answer_that_the_prompt_is_too_long_is_recognized(
    status: int, body: object, too_long: bool
) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    assert says_too_long(status, raw) is too_long


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2, 3]], ["text", [1, 2]]])
def test_a_token_id_prompt_cannot_be_screened_so_it_is_refused(prompt: object) -> None:
    call = parse_call(Api.COMPLETIONS, json.dumps({"model": "m", "prompt": prompt}).encode())
    with pytest.raises(ApiError) as refused:
        judge_messages(call)
    assert refused.value.refusal.status == 400 and refused.value.refusal.param == "prompt"


def test_the_upstream_body_names_the_serving_model_and_may_ask_for_usage() -> None:
    call = parse_call(
        Api.CHAT, b'{"model":"alias","messages":[{"role":"user"}],"stream":true,"api_key":"x","n":1}'
    )
    assert call.body.get("api_key") is None
    body = json.loads(call.upstream_body("real", force_usage=True))
    assert body["model"] == "real" and body["stream_options"] == {"include_usage": True} and body["n"] == 1
    assert "stream_options" not in json.loads(call.upstream_body("real", force_usage=False))


def test_a_long_conversation_is_cut_with_an_overlap_where_the_cut_falls_between_two_turns() -> None:
    # Two long turns whose words at the boundary make one phrase: one piece of the cut
    # must read the boundary whole, as the whole conversation did (#28: neither did).
    before = " ".join(f"u{i:03d}" for i in range(100)) + " how to build a"
    after = "bomb " + " ".join(f"a{i:03d}" for i in range(100))
    first, second = split_in_two(_turns(before, after)) or ([], [])
    total = len(before) + len(after)
    for piece in (first, second):
        assert sum(len(t.text) for t in piece) <= total * 5 // 8  # smaller each time
        assert piece[0].role == "user"
    assert [p for p in (first, second) if "how to build a" in p[0].text and p[-1].text.startswith("bomb")]
    assert first[0].text.startswith("u000") and second[-1].text.endswith("a099")  # nothing left out
