"""``ConnectionLog``, the logger every llmgw listener gives aiohttp: a malformed request is
one line without its bytes, at most one per interval, and the next line counts the rest.
(What aiohttp's real parser makes of real bytes is in
``tests/component/gateway/test_malformed_requests.py``.)"""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage

from llmgw.http_server import ConnectionLog

NAME = "test.connection-log"
# As aiohttp's C parser words an error whose line had no CRLF: the whole buffer.
LEAKY = BadHttpMessage(
    "Expected CRLF after version:\n\n"
    "  b'POST /v1/chat/completions HTTP/1.1\\nAuthorization: Bearer sk-llmgw-a.SECRET'\n  ^"
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _as_aiohttp_logs_it(log: ConnectionLog, exc: BaseException) -> None:
    # web_protocol.RequestHandler.handle_error, aiohttp 3.14
    log.exception("Error handling request from %s", "192.0.2.7", exc_info=exc)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == NAME]


def test_a_flood_is_one_line_per_interval_and_the_next_counts_what_was_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = ConnectionLog(logging.getLogger(NAME), interval=10.0, clock=clock)
    with caplog.at_level(logging.DEBUG, logger=NAME):
        for _ in range(50):
            _as_aiohttp_logs_it(log, LEAKY)
            clock.now += 0.1
        assert len(_lines(caplog)) == 1
        clock.now = 1012.0
        _as_aiohttp_logs_it(log, LEAKY)
        _as_aiohttp_logs_it(log, LEAKY)  # within the new interval: counted for the line after
    first, second = _lines(caplog)
    assert first == (
        "refused a malformed request from 192.0.2.7: POST /v1/chat/completions: "
        "Expected CRLF after version (BadHttpMessage) (its bytes are not logged)"
    )
    assert second.endswith("; 49 more in the 12 s before, not logged one by one")
    assert "SECRET" not in caplog.text and "Bearer" not in caplog.text
    assert {r.levelno for r in caplog.records} == {logging.WARNING}  # the client's fault, not ours
    assert all(r.exc_info is None for r in caplog.records)  # no traceback: it would carry the bytes


def test_a_clock_that_went_back_does_not_silence_the_log(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = ConnectionLog(logging.getLogger(NAME), interval=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger=NAME):
        _as_aiohttp_logs_it(log, LEAKY)
        clock.now -= 500.0
        _as_aiohttp_logs_it(log, LEAKY)
    assert len(_lines(caplog)) == 2


def test_what_the_level_hides_is_not_counted_and_other_records_pass_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = ConnectionLog(logging.getLogger(NAME), interval=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger=NAME):
        # aiohttp logs TLS sent to a plain port at DEBUG (web_protocol, handle_error).
        log.debug("Error handling request from %s", "192.0.2.7", exc_info=BadHttpMessage("x"))
        _as_aiohttp_logs_it(log, LEAKY)
        bug = RuntimeError("a handler bug")
        log.exception("Error handling request from %s", "192.0.2.7", exc_info=bug)
        log.warning("Error handling request")
    lines = _lines(caplog)
    assert len(lines) == 3 and "more in the" not in lines[0]
    assert lines[1:] == ["Error handling request from 192.0.2.7", "Error handling request"]
    assert caplog.records[1].exc_info is not None and caplog.records[1].exc_info[1] is bug
