"""OpenTelemetry tracing, optional (``pip install 'cacheon[otel]'``) and off by default.

One span per proxied request, a child of the client's ``traceparent`` when it sends one, carrying
the route decision; the span's context goes to the worker in the same W3C headers. Imported only
when ``tracing.enabled`` is set, so the gateway runs without the SDK installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cacheon.errors import UsageError
from cacheon.gateway.config import TracingConfig


class Tracing:
    """A tracer provider of its own (never the process-global one) and the request spans it makes."""

    def __init__(self, cfg: TracingConfig, processor: Any = None) -> None:
        """``processor``: a span processor to use instead of the configured exporter (tests)."""
        try:
            from opentelemetry import propagate, trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
        except ImportError:
            raise UsageError("tracing.enabled needs OpenTelemetry: pip install 'cacheon[otel]'") from None
        self._trace, self._propagate = trace, propagate
        self.provider = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}))
        if processor is None:
            if cfg.exporter == "console":
                exporter: Any = ConsoleSpanExporter()
            else:
                try:
                    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
                except ImportError:
                    raise UsageError("tracing.exporter otlp needs opentelemetry-exporter-otlp-proto-http: "
                                     "pip install 'cacheon[otel]'") from None
                exporter = OTLPSpanExporter(endpoint=cfg.endpoint) if cfg.endpoint else OTLPSpanExporter()
            processor = BatchSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer("cacheon.gateway")

    def start(self, name: str, headers: Mapping[str, str], request_id: str) -> Any:
        parent = self._propagate.extract(dict(headers))
        span = self._tracer.start_span(name, context=parent, kind=self._trace.SpanKind.SERVER)
        span.set_attribute("cacheon.request_id", request_id)
        return span

    def inject(self, span: Any, headers: dict[str, str]) -> None:
        """The span's context into the upstream request's headers (``traceparent``)."""
        self._propagate.inject(headers, context=self._trace.set_span_in_context(span))

    def finish(self, span: Any, *, status: int, **attributes: Any) -> None:
        span.set_attribute("http.response.status_code", status)
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(f"cacheon.{key}", value)
        if status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end()

    def close(self) -> None:
        self.provider.shutdown()
