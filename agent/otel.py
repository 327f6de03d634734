"""Each call's latency trace as OpenTelemetry spans over OTLP/HTTP: a ``call`` span, a child per
turn, and under each turn a child per stage span with its budget. Optional (``voxline[otel]``):
the OpenTelemetry packages are imported only when an exporter is built.

Spans are made after the fact from the trace's records, with explicit times: the trace stamps
monotonic nanoseconds, and one wall-clock offset taken at the call's start
(``observe.wall_offset_ns``) turns them into epoch time, so every duration inside a call is
exactly the trace's (a clock step during the call moves no span). The call span
opens at the session's start and ends at its close; turn spans are sent as each turn finishes,
so a long call's turns reach the collector during the call. Export runs on the SDK's batch
thread, never on the event loop; the loop pays only for building the spans of a finished turn.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent import observe
from agent.errors import ConfigError, require

if TYPE_CHECKING:
    from agent.session import Session

log = logging.getLogger("voxline.otel")

EXTRA = "otel"
SERVICE_NAME = "voxline"
TRACER_NAME = "voxline"

# A call event (``trace.call_event(name, ...)``) is a span event on the call span, unless its name
# is in ``event_spans``: then the function turns the event record ({"event", "t_ns", fields...})
# into a child span of the call: (start monotonic ns, end monotonic ns, attributes), or None to
# keep it a span event. Call events reach the exporter with the session's summary (the latest
# 32 of them).
EventSpan = Callable[[Mapping[str, Any]], tuple[int, int, dict[str, Any]] | None]


def _tool_span(event: Mapping[str, Any]) -> tuple[int, int, dict[str, Any]] | None:
    """The LLM stage's ``tool_call`` event (its start, ``ms``, ``tool``, ``outcome``) as a span."""
    try:
        start, ms = int(event["t_ns"]), float(event["ms"])
    except (KeyError, TypeError, ValueError):
        return None
    return start, start + round(ms * 1e6), {"voxline.tool": str(event.get("tool", "")),
                                            "voxline.outcome": str(event.get("outcome", ""))}


EVENT_SPANS: dict[str, EventSpan] = {"tool_call": _tool_span}  # the default ``event_spans``
PRIVATE_FIELDS = frozenset({"text", "reply"})  # what the caller or the agent said


def enabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user configured OTLP trace export in the environment: an OTLP endpoint (or
    ``OTEL_TRACES_EXPORTER=otlp``), the traces exporter not set to something else, and the SDK
    not disabled. Reads the environment only, so a server can ask without the extra installed."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [x.strip().lower() for x in env.get("OTEL_TRACES_EXPORTER", "").split(",") if x.strip()]
    if exporters and "otlp" not in exporters:
        return False
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(endpoint) or "otlp" in exporters


def traces_endpoint(env: Mapping[str, str]) -> str:
    """Where OTLP/HTTP traces go, as the specification resolves it from the environment: the
    traces endpoint as given, else the base endpoint with ``/v1/traces``. For the server's
    start-up line only; the OpenTelemetry exporter resolves it again for itself."""
    if traces := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return f"{base.removesuffix('/')}/v1/traces"


def _protocol(env: Mapping[str, str]) -> str:
    return (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()


@dataclass(slots=True, frozen=True)
class _Call:
    """One live call: its span, the context its turns hang from, and its wall-clock offset."""

    span: Any
    context: Any
    offset_ns: int


class OtelExporter:
    """A call observer (``observe.watch(exporter)``) that sends each call as a tree of spans.

    ``span_exporter`` is any SDK ``SpanExporter`` (default: OTLP/HTTP configured by the standard
    ``OTEL_EXPORTER_OTLP_*`` variables, read by the OpenTelemetry exporter itself; ``endpoint``
    says where, for a start-up line). The tracer
    provider is private: the process's global one is left alone, so an application's own
    OpenTelemetry setup is neither replaced nor mixed with the calls' spans. The resource is the
    SDK's (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), with ``service.name`` defaulting to
    ``voxline`` instead of ``unknown_service``.

    The caller's words and the agent's reply are not exported unless ``include_text`` (spans
    leave the machine; transcripts are personal data); their lengths always are.
    """

    def __init__(
        self,
        span_exporter: Any = None,
        *,
        include_text: bool = False,
        service_name: str = SERVICE_NAME,
        event_spans: Mapping[str, EventSpan] | None = None,
    ) -> None:
        what = "OpenTelemetry export"
        sdk_trace = require("opentelemetry.sdk.trace", what=what, extra=EXTRA, package="opentelemetry-sdk")
        export = require("opentelemetry.sdk.trace.export", what=what, extra=EXTRA, package="opentelemetry-sdk")
        resources = require("opentelemetry.sdk.resources", what=what, extra=EXTRA, package="opentelemetry-sdk")
        self._api = require("opentelemetry.trace", what=what, extra=EXTRA, package="opentelemetry-api")
        if span_exporter is None:
            http = require("opentelemetry.exporter.otlp.proto.http.trace_exporter", what=what,
                           extra=EXTRA, package="opentelemetry-exporter-otlp-proto-http")
            span_exporter = http.OTLPSpanExporter()
            self.endpoint = traces_endpoint(os.environ)
        else:
            self.endpoint = type(span_exporter).__name__
        detected = resources.Resource.create()
        attrs = dict(detected.attributes)
        if str(attrs.get("service.name", "")).startswith("unknown_service"):
            attrs["service.name"] = service_name  # the SDK's fallback: no name was configured
        self.resource = resources.Resource(attrs, detected.schema_url)
        self.provider = sdk_trace.TracerProvider(resource=self.resource)
        # the batch processor hands spans to its own thread: the loop never waits on the network
        self.provider.add_span_processor(export.BatchSpanProcessor(span_exporter))
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self.include_text = include_text
        self.event_spans: dict[str, EventSpan] = dict(EVENT_SPANS if event_spans is None
                                                      else event_spans)
        self._calls: dict[str, _Call] = {}

    @classmethod
    def from_env(cls, **options: Any) -> OtelExporter:
        """The OTLP/HTTP exporter the environment describes. The OpenTelemetry exporter reads
        endpoint, headers, timeout, compression and certificates itself; only the protocol is
        checked here, since this exporter speaks http/protobuf alone."""
        protocol = _protocol(os.environ)
        if protocol != "http/protobuf":
            raise ConfigError(
                f"OTLP protocol {protocol!r} is not supported: voxline exports traces over "
                "http/protobuf — set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and point "
                "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (usually 4318)")
        return cls(**options)

    # --- the observer ------------------------------------------------------------------------
    def call_started(self, session: Session) -> None:
        offset = observe.wall_offset_ns()
        started = session.started_ns or time.monotonic_ns()
        span = self.tracer.start_span(
            "call", kind=self._api.SpanKind.SERVER, start_time=started + offset,
            attributes={"session.id": session.id})
        call = _Call(span, self._api.set_span_in_context(span), offset)
        self._calls[session.id] = call
        session.trace.listeners.append(lambda record: self._record(call, record))

    def call_ended(self, session: Session, summary: dict[str, Any]) -> None:
        call = self._calls.pop(session.id, None)
        if call is None:
            return
        for event in summary.get("events", ()):
            try:
                self._event(call, event)
            except Exception:  # an event_spans hook failing must not keep the call span open
                log.exception("could not export call event %r of %s", event.get("event"), session.id)
        violations = summary.get("violations") or {}
        span = call.span
        span.set_attributes({
            "voxline.reason": summary.get("reason", ""),
            "voxline.turns": int(summary.get("turns", 0)),
            "voxline.violations": int(sum(violations.values())),
            "voxline.violated_spans": sorted(violations),
        })
        if summary.get("reason") == "error":
            span.set_status(self._api.Status(self._api.StatusCode.ERROR, "the call ended on an error"))
        span.end(end_time=time.monotonic_ns() + call.offset_ns)

    def shutdown(self) -> None:
        """End the spans of calls still open (marked ``voxline.open_at_shutdown``), send what
        is queued and stop. Blocks up to the exporter's timeout: call it off the event loop
        (``await asyncio.to_thread(exporter.shutdown)``)."""
        for sid in list(self._calls):
            call = self._calls.pop(sid, None)
            if call is not None:
                call.span.set_attribute("voxline.open_at_shutdown", True)
                call.span.end(end_time=time.monotonic_ns() + call.offset_ns)
        self.provider.shutdown()

    def force_flush(self, timeout_ms: int = 30_000) -> bool:
        return bool(self.provider.force_flush(timeout_ms))

    # --- records to spans --------------------------------------------------------------------
    def _record(self, call: _Call, record: dict[str, Any]) -> None:
        # a trace listener runs inside the call (on the playout's audio_out): never break it
        try:
            self._turn(call, record)
        except Exception:
            log.exception("could not make spans for %s turn %s", record.get("session"),
                          record.get("turn"))

    def _turn(self, call: _Call, record: dict[str, Any]) -> None:
        """A finished turn (or greeting, or any later record kind of the same shape): a child
        of the call named after its type, spanning its events, with a child per stage span."""
        t0 = int(record.get("t0_ns") or 0)
        off = call.offset_ns
        text, reply = record.get("text") or "", record.get("reply") or ""
        spans: dict[str, dict[str, Any]] = record.get("spans") or {}
        attrs: dict[str, Any] = {
            "session.id": record.get("session", ""),
            "voxline.turn": int(record.get("turn", 0)),
            "voxline.complete": bool(record.get("complete")),
            "voxline.text_length": len(text),
            "voxline.reply_length": len(reply),
            "voxline.over_budget": any(s["over"] for s in spans.values()),
        }
        if self.include_text:
            attrs["voxline.text"], attrs["voxline.reply"] = text, reply
        info = record.get("info") or {}
        for k, v in info.items():
            if isinstance(v, (bool, int, float, str)):
                attrs[f"voxline.info.{k}"] = v
        kind = str(record.get("type", "turn"))
        if not t0:  # no origin event: the turn cannot be placed in time; mark it where it ended
            now = time.monotonic_ns() + off
            attrs["voxline.no_origin"] = True
            self.tracer.start_span(kind, call.context, start_time=now, attributes=attrs).end(now)
            return
        marks = [float(ms) for ms in (record.get("events_ms") or {}).values()] or [0.0]
        start, end = t0 + _ns(min(0.0, min(marks))), t0 + _ns(max(marks))
        turn = self.tracer.start_span(kind, call.context, start_time=start + off, attributes=attrs)
        if "error" in info:
            turn.set_status(self._api.Status(self._api.StatusCode.ERROR, str(info["error"])))
        parent = self._api.set_span_in_context(turn)
        for name, s in spans.items():
            stage_attrs: dict[str, Any] = {"voxline.ms": float(s["ms"]),
                                           "voxline.over_budget": bool(s["over"])}
            if s.get("budget_ms") is not None:
                stage_attrs["voxline.budget_ms"] = float(s["budget_ms"])
            a, b = t0 + _ns(s["start_ms"]), t0 + _ns(s["end_ms"])
            end = max(end, b)
            self.tracer.start_span(name, parent, start_time=a + off, attributes=stage_attrs).end(b + off)
        turn.end(end_time=end + off)

    def _event(self, call: _Call, event: Mapping[str, Any]) -> None:
        name = str(event.get("event", ""))
        t_ns = int(event.get("t_ns") or 0) or time.monotonic_ns()
        fields = {f"voxline.{k}": v for k, v in event.items()
                  if k not in ("event", "t_ns") and isinstance(v, (bool, int, float, str))
                  and (self.include_text or k not in PRIVATE_FIELDS)}
        to_span = self.event_spans.get(name)
        made = to_span(event) if to_span is not None else None
        if made is None:
            call.span.add_event(name, fields, timestamp=t_ns + call.offset_ns)
            return
        a, b, attrs = made
        self.tracer.start_span(name, call.context, start_time=a + call.offset_ns,
                               attributes={**fields, **attrs}).end(b + call.offset_ns)


def _ns(ms: float) -> int:
    return round(float(ms) * 1_000_000)
