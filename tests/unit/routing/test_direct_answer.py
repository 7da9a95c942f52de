"""When ``dispatch._DirectAnswer`` writes an engine's answer to the client from the
engine connection's callbacks, and what it writes: only a final answer (whole, within
the size limit; or a stream's 200 with its first chunk), with headers that cannot
smuggle a line, to a client still there, and never once the first-byte timeout fired."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from llmgw.gateway.dispatch import _DirectAnswer, answer_fields

FIELDS = "x-request-id: abc\r\nx-llmgw-model: m\r\nx-llmgw-replica: r1\r\n"


@dataclass
class FakeClient:
    closing: bool = False
    written: list[bytes] = field(default_factory=list)

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.written.append(data)


@dataclass
class FakeTimeout:
    fired: bool = False
    when: float | None = 5.0

    def expired(self) -> bool:
        return self.fired

    def reschedule(self, when: float | None) -> None:
        self.when = when


@dataclass
class FakeAnswer:
    status: int = 200
    body: bytes | None = b'{"ok":true}'
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})

    chunk: bytes = b"data: {}\n\n"
    armed: list[object] = field(default_factory=list)

    def peek_whole(self) -> bytes | None:
        return self.body

    def peek(self) -> bytes:
        return self.chunk

    def call_when_ready(self, hook: object) -> None:
        self.armed.append(hook)


def _answer(
    client: FakeClient, timeout: FakeTimeout, answer: FakeAnswer, limit: int = 1000, *, stream: bool = False
) -> bool:
    direct = _DirectAnswer(client, FIELDS, limit, stream=stream)  # type: ignore[arg-type]
    direct.timeout = timeout  # type: ignore[assignment]
    direct(answer)  # type: ignore[arg-type]
    for hook in answer.armed:  # a stream's first chunk arrives
        hook(answer)  # type: ignore[operator]
    return direct.sent


def test_a_whole_final_answer_goes_out_in_one_write_and_the_timeout_is_switched_off() -> None:
    client, timeout = FakeClient(), FakeTimeout()
    assert _answer(client, timeout, FakeAnswer())
    assert timeout.when is None
    [data] = client.written
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK"
    assert "Content-Length: 11" in lines and "Content-Type: application/json" in lines
    assert "x-llmgw-replica: r1" in lines and any(line.startswith("Date: ") for line in lines)
    assert body == b'{"ok":true}'


def test_an_engine_error_goes_out_with_its_own_status() -> None:
    client = FakeClient()
    assert _answer(client, FakeTimeout(), FakeAnswer(status=400, body=b'{"error":{}}'))
    assert client.written[0].startswith(b"HTTP/1.1 400 Bad Request\r\n")


@pytest.mark.parametrize(
    ("client", "timeout", "answer", "why"),
    [
        (
            FakeClient(),
            FakeTimeout(),
            FakeAnswer(status=503),
            "a retryable status: the router tries elsewhere",
        ),
        (FakeClient(), FakeTimeout(), FakeAnswer(status=502), "a retryable status"),
        (FakeClient(), FakeTimeout(), FakeAnswer(body=None), "the body is still coming"),
        (FakeClient(), FakeTimeout(), FakeAnswer(body=b"x" * 1001), "over the size limit"),
        (FakeClient(), FakeTimeout(fired=True), FakeAnswer(), "the first-byte timeout already fired"),
        (FakeClient(closing=True), FakeTimeout(), FakeAnswer(), "the client left"),
        (
            FakeClient(),
            FakeTimeout(),
            FakeAnswer(headers={"content-type": "text/plain\rSet-Cookie: x=1"}),
            "a header value that would smuggle a line",
        ),
        (
            FakeClient(),
            FakeTimeout(),
            FakeAnswer(headers={"content-type": "application/json; charset=\u00e9t\u00e9"}),
            "a header value that is not ASCII",
        ),
    ],
)
def test_anything_not_final_or_not_sendable_is_left_to_the_handler(
    client: FakeClient, timeout: FakeTimeout, answer: FakeAnswer, why: str
) -> None:
    assert not _answer(client, timeout, answer), why
    assert client.written == [], why
    assert timeout.when == 5.0, why  # the first-byte timeout still guards the attempt


@pytest.mark.parametrize("replica", ["r1\r\nSet-Cookie: x=1", "r1\nx", "r1\x00", "r\u00e9plica"])
def test_no_header_line_is_made_from_a_value_that_could_smuggle_one(replica: str) -> None:
    assert answer_fields("abc", "m", replica) is None  # the handler's path answers instead


def test_the_router_header_lines() -> None:
    assert answer_fields("abc", "m", "r1") == FIELDS
