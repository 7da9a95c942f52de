"""Timestamps inside a proxy process, for ``router_proxy.py --stages``: where a
non-streamed request's time goes, stage by stage, in the router and in the plain
aiohttp proxy under the same load.

Python imports this module at start-up when its folder is on ``PYTHONPATH``; the
bench puts it there for the proxies only (the engine refuses a ``PYTHONPATH``).
It does nothing unless ``LLMGW_BENCH_STAGES`` names the JSON file to write at
exit; ``LLMGW_BENCH_STAGES_ROUTER`` adds the router's own steps. It wraps
aiohttp's and llmgw's functions, so its figures include the wrappers' own cost,
the same for every proxy; it follows aiohttp's internals
(``RequestHandler.data_received``, ``_handle_request``, ``StreamWriter._write``)
and must follow them when they change.
"""

from __future__ import annotations

import os

if os.environ.get("LLMGW_BENCH_STAGES"):
    import atexit
    import contextvars
    import itertools
    import json
    import statistics
    import time
    from collections.abc import Callable
    from typing import Any

    from aiohttp import http_writer, web, web_protocol

    from llmgw.gateway import transport

    _OUT = os.environ["LLMGW_BENCH_STAGES"]
    _now = time.perf_counter
    _marks: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("marks", default=None)
    _arrived: dict[int, float] = {}  # per server connection: when its last bytes came
    _answered: dict[int, float] = {}  # per engine connection: when its answer's head came
    _whole: list[dict[str, float]] = []
    # Coarse stages, for every aiohttp proxy: (name, from mark, to mark).
    COARSE = (
        ("bytes in to the request's task", "in", "task"),
        ("the task to the engine write", "task", "write"),
        ("the engine's answer to the client write", "head", "out"),
    )
    # The router's steps from its task to the engine write (marks set by the wrappers below).
    FINE = ("task", "observe", "auth", "handler", "parse", "parsed", "serve", "attempt", "post", "write")

    def _mark(key: str) -> None:
        marks = _marks.get()
        if marks is not None and key not in marks:
            marks[key] = _now()

    original_data_received = web_protocol.RequestHandler.data_received

    def data_received(self: Any, data: bytes) -> None:
        _arrived[id(self)] = _now()
        original_data_received(self, data)

    original_handle = web_protocol.RequestHandler._handle_request

    async def handle_request(self: Any, request: Any, start_time: Any, request_handler: Any) -> Any:
        _marks.set({"in": _arrived.get(id(self), _now()), "task": _now()})
        return await original_handle(self, request, start_time, request_handler)

    original_exchange = transport._Connection.exchange
    _direct_sent: dict[int, float] = {}  # per armed on_head hook: when it sent the answer

    async def exchange(self: Any, head: bytes, body: bytes, *, reused: bool, on_head: Any = None) -> Any:
        marks = _marks.get()
        if marks is not None:
            marks["write"] = _now()
            marks["stream"] = float(b'"stream":true' in body or b'"stream": true' in body)
        hook = None if on_head is None else _timed_hook(on_head)
        response = await original_exchange(self, head, body, reused=reused, on_head=hook)
        if marks is not None:
            marks["head"] = _answered.get(id(self), _now())
            marks["resumed"] = _now()
            sent_at = _direct_sent.pop(id(hook), None)
            if sent_at is not None:  # the router wrote the answer from the engine's callback
                marks["out"] = sent_at
                if not marks["stream"]:
                    _whole.append(marks)
        return response

    _direct_sends = [0]  # answers ``dispatch._DirectAnswer`` sent (counted by a wrapper below)

    def _timed_hook(on_head: Callable[[Any], None]) -> Callable[[Any], None]:
        # The hook runs in the engine connection's callback, outside the request's
        # context: its time is kept by the hook's id and read back in the task. The
        # router's hook wraps ``_DirectAnswer`` (``Upstream.send``), so whether it sent
        # is seen by the count, not by an attribute of the hook.
        def hook(response: Any) -> None:
            before = _direct_sends[0]
            on_head(response)
            if _direct_sends[0] != before:
                _direct_sent[id(hook)] = _now()

        return hook

    original_head_data = transport._Connection._head_data

    def head_data(self: Any, data: bytes) -> None:
        _answered[id(self)] = _now()
        original_head_data(self, data)

    def _first_write() -> None:
        marks = _marks.get()
        if marks is None or "resumed" not in marks or "out" in marks:
            return
        marks["out"] = _now()
        if not marks["stream"]:
            _whole.append(marks)

    def _before(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _first_write()
            return original(self, *args, **kwargs)

        return wrapper

    web_protocol.RequestHandler.data_received = data_received  # type: ignore[method-assign]
    web_protocol.RequestHandler._handle_request = handle_request  # type: ignore[method-assign]
    transport._Connection.exchange = exchange  # type: ignore[method-assign]
    transport._Connection._head_data = head_data  # type: ignore[method-assign]
    http_writer.StreamWriter._write = _before(http_writer.StreamWriter._write)  # type: ignore[method-assign]
    http_writer.StreamWriter._writelines = _before(http_writer.StreamWriter._writelines)  # type: ignore[method-assign]

    if os.environ.get("LLMGW_BENCH_STAGES_ROUTER"):  # the router's own steps
        from llmgw.gateway import calls, dispatch, handlers, middlewares

        def _mark_middleware(name: str, key: str) -> None:
            original = getattr(middlewares, name)

            @web.middleware
            async def wrapper(request: web.Request, handler: Any) -> Any:
                _mark(key)
                return await original(request, handler)

            setattr(middlewares, name, wrapper)

        def _mark_async(owner: Any, name: str, key: str) -> None:
            original = getattr(owner, name)

            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                _mark(key)
                return await original(*args, **kwargs)

            setattr(owner, name, wrapper)

        def _mark_parse(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                _mark("parse")
                result = original(*args, **kwargs)
                _mark("parsed")
                return result

            return wrapper

        _mark_middleware("observe", "observe")
        original_authenticate = middlewares.authenticate

        def authenticate(request: web.Request, *args: Any) -> None:  # whatever it takes besides
            _mark("auth")
            original_authenticate(request, *args)

        middlewares.authenticate = authenticate
        _mark_async(handlers, "chat_completions", "handler")
        setattr(handlers, "parse_call", _mark_parse(calls.parse_call))  # noqa: B010 - rebinding the name handlers calls
        _mark_async(dispatch.Dispatcher, "serve", "serve")
        _mark_async(dispatch.Dispatcher, "_attempt", "attempt")
        _mark_async(transport.EnginePool, "post", "post")
        original_send = dispatch._DirectAnswer._send

        def direct_send(self: Any, *args: Any) -> None:
            original_send(self, *args)
            _direct_sends[0] += 1

        dispatch._DirectAnswer._send = direct_send  # type: ignore[method-assign]

    def _median_us(samples: list[dict[str, float]], start: str, end: str) -> float | None:
        spans = [m[end] - m[start] for m in samples if start in m and end in m]
        return round(statistics.median(spans) * 1e6, 1) if spans else None

    def _write_figures() -> None:
        samples = _whole[len(_whole) // 5 :]  # the first fifth warms up
        figures = {
            "requests": len(samples),
            "coarse": {name: _median_us(samples, a, b) for name, a, b in COARSE},
            "fine": {f"{a} -> {b}": _median_us(samples, a, b) for a, b in itertools.pairwise(FINE)},
        }
        with open(_OUT, "w") as out:
            json.dump(figures, out)

    atexit.register(_write_figures)
