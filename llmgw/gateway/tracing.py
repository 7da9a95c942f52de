"""The router's traces: the client's W3C trace context on to the engines, and (with an OTLP
endpoint configured) one OpenTelemetry span per request.

Owns: ``Tracing``, built once per app from OpenTelemetry's own environment variables
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``; with
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` no span is recorded, as the SDK's
own auto-configuration reads them), and ``RequestTrace``, what one request carries.

Without an endpoint the router records nothing and passes a client's valid ``traceparent``
and ``tracestate`` on unchanged (``llmgw.core.tracing`` checks them), so an engine that
traces (vLLM reads both headers: ``vllm/tracing/utils.py``, ``TRACE_HEADERS``, 0.34.0) joins
the client's trace. With one, the router's span is the client's span's child and the
engines get the router's span as their parent. The SDK (``opentelemetry-sdk`` with the
OTLP/HTTP exporter, the ``otel`` extra) is imported only then.

Must not: decide what a header may carry (``llmgw.core.tracing``) or block the event loop:
spans are exported from the SDK's BatchSpanProcessor thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from llmgw.core.tracing import SpanFacts, client_trace_headers, span_attributes, span_name

log = logging.getLogger(__name__)

_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "llmgw-router"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names one


class RequestTrace(Protocol):
    """One request's trace: the headers its engine requests carry, and its end."""

    @property
    def headers(self) -> tuple[tuple[str, str], ...]: ...

    def end(self, facts: SpanFacts | None) -> None: ...


class _PassedOn:
    __slots__ = ("headers",)

    def __init__(self, headers: tuple[tuple[str, str], ...]) -> None:
        self.headers = headers

    def end(self, facts: SpanFacts | None) -> None:
        return None


NO_TRACE: RequestTrace = _PassedOn(())


class Tracing:
    """Pass-through: the client's checked trace context, and no span of the router's."""

    def begin(self, headers: Mapping[str, str]) -> RequestTrace:
        found = client_trace_headers(headers)
        return _PassedOn(found) if found else NO_TRACE

    def shutdown(self) -> None:
        return None


class _Span:
    __slots__ = ("_span", "headers")

    def __init__(self, span: Any, headers: tuple[tuple[str, str], ...]) -> None:
        self._span = span
        self.headers = headers

    def end(self, facts: SpanFacts | None) -> None:
        if facts is not None:
            self._span.update_name(span_name(facts))
            self._span.set_attributes(span_attributes(facts))
            if facts.status >= 500:
                from opentelemetry.trace import Status, StatusCode

                self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()


class OtlpTracing(Tracing):
    """A span per model request, exported over OTLP/HTTP from the SDK's batch thread."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, but an attribute
        # given here would win over them: the default is given only when they name none.
        named = bool(environ.get("OTEL_SERVICE_NAME")) or "service.name=" in environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        resource = Resource.create({} if named else {"service.name": SERVICE_NAME})
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer = self._provider.get_tracer("llmgw.gateway")
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER
        self._in_context = set_span_in_context

    def begin(self, headers: Mapping[str, str]) -> RequestTrace:
        parent = self._propagator.extract(dict(client_trace_headers(headers)))
        span = self._tracer.start_span("llmgw request", context=parent, kind=self._server)
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._in_context(span))
        return _Span(span, tuple(carrier.items()))

    def shutdown(self) -> None:
        self._provider.shutdown()  # flushes what the batch holds


class TracingUnavailable(RuntimeError):
    pass


def tracing_from_environment(environ: Mapping[str, str]) -> Tracing:
    """OTLP spans when OpenTelemetry's variables ask for them, else pass-through."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Tracing()
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return Tracing()
    if not any(environ.get(name, "").strip() for name in _ENDPOINT_VARIABLES):
        return Tracing()
    try:
        tracing = OtlpTracing(environ)
    except ImportError as exc:
        raise TracingUnavailable(
            f"{' or '.join(_ENDPOINT_VARIABLES)} is set, but OpenTelemetry's SDK is not installed "
            f"({exc.name}): pip install 'llmgw[otel]', or unset the variable"
        ) from None
    log.info("exporting a span per request over OTLP/HTTP")
    return tracing
