"""Prometheus metrics of a server process (``prometheus-client``, imported when a server builds
its :class:`Metrics`; the package comes with the ``web``, ``telephony`` and ``serve`` extras).

Two kinds of source feed one registry:

* **per turn and per call**, pushed as they happen: :class:`Metrics` is a call observer
  (:mod:`agent.observe`); each finished turn observes its spans into ``voxline_span_seconds``
  and counts spans over budget; calls started, active and ended (by reason) are counted.
  Nothing is done per frame.
* **at scrape time**, pulled: servers and engines keep plain counters (slots in use, batch sizes,
  refusals, dropped frames) and hand them over as :class:`agent.ops.Sample` lists when
  ``/metrics`` is read.

Names follow Prometheus' conventions (``voxline_`` prefix, base units, ``_total`` counters) and
no label names a call: a label's values are few and fixed (span names, reasons, transports).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from agent.errors import require
from agent.observe import Session
from agent.ops import Sample

SampleSource = Callable[[], Iterable[Sample]]

# latency spans run from ~1 ms (transport send) to seconds (voice-to-voice on a busy machine)
SPAN_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
                  5.0, 10.0)
LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_REASON = re.compile(r"[a-z][a-z0-9_]{0,31}")


def reason_label(reason: str) -> str:
    """A call's end reason as a label value: the known short words pass, anything else (free
    text a caller or a tool could choose) is ``other``, so the label's values stay few."""
    return reason if _REASON.fullmatch(reason or "") else "other"


class Metrics:
    """The metrics registry of one server process; ``server`` names the command (``serve``,
    ``sip``, ``twilio``, ``asr-serve``), exported as ``voxline_server_info``."""

    def __init__(self, server: str) -> None:
        require("prometheus_client", what="Prometheus metrics", extra="web",
                package="prometheus-client")
        import prometheus_client as prom

        self._prom = prom
        self.registry = prom.CollectorRegistry(auto_describe=False)
        r = self.registry
        info = prom.Info("voxline_server", "The voxline command this process runs.", registry=r)
        info.info({"server": server})
        self.span = prom.Histogram(
            "voxline_span_seconds", "Latency of each trace span of a turn (a turn runs from the "
            "end of the caller's speech to the agent's first audio).", ["span"],
            buckets=SPAN_BUCKETS_S, registry=r)
        self.partial_lag = prom.Histogram(
            "voxline_partial_lag_seconds", "How far a partial transcript lags the audio it "
            "covers.", buckets=SPAN_BUCKETS_S, registry=r)
        self.violations = prom.Counter(
            "voxline_budget_violations", "Trace spans over their latency budget.", ["span"],
            registry=r)
        self.turns = prom.Counter(
            "voxline_turns", "Turns finished, by kind, and whether the agent's audio went out "
            "(complete) or the turn was abandoned (interrupted, nothing to say).",
            ["kind", "complete"], registry=r)
        self.calls = prom.Counter("voxline_calls", "Calls started.", registry=r)
        self.active = prom.Gauge("voxline_calls_active", "Calls in progress.", registry=r)
        self.ended = prom.Counter("voxline_calls_ended", "Calls ended, by reason.", ["reason"],
                                  registry=r)
        self.failed = prom.Counter("voxline_calls_failed", "Calls that ended on an error.",
                                   registry=r)
        self.loop_lag = prom.Histogram(
            "voxline_event_loop_lag_seconds", "How late the event loop ran a timer (what every "
            "call's audio waits on top of its work).", buckets=LAG_BUCKETS_S, registry=r)
        self.stalls = prom.Counter(
            "voxline_event_loop_stalls", "Times the event loop ran nothing else for longer "
            "than the watchdog's threshold.", registry=r)
        self._sources: list[SampleSource] = []
        r.register(_Pulled(self._sources))

    # --- sources ------------------------------------------------------------------------------
    def add_source(self, source: SampleSource) -> None:
        """Samples to read at every scrape (a server's counters, an engine's)."""
        self._sources.append(source)

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its content type."""
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST

    # --- the event loop ----------------------------------------------------------------------
    def observe_lag(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)

    def observe_stall(self, seconds: float) -> None:
        self.stalls.inc()

    # --- a call observer (agent.observe) -----------------------------------------------------
    def call_started(self, session: Session) -> None:
        self.calls.inc()
        self.active.inc()
        session.trace.listeners.append(self._turn)

    def call_ended(self, session: Session, summary: dict[str, Any]) -> None:
        self.active.dec()
        reason = str(summary.get("reason", ""))
        self.ended.labels(reason_label(reason)).inc()
        if reason == "error":
            self.failed.inc()
        for ms in summary.get("partial_lag_ms", ()):
            self.partial_lag.observe(ms / 1000)

    def _turn(self, record: dict[str, Any]) -> None:
        self.turns.labels(record["type"], "true" if record["complete"] else "false").inc()
        for name, span in record["spans"].items():
            self.span.labels(name).observe(span["ms"] / 1000)
            if span["over"]:
                self.violations.labels(name).inc()


class _Pulled:
    """A prometheus-client collector over the scrape-time sources: samples of one name form
    one metric family."""

    def __init__(self, sources: list[SampleSource]) -> None:
        self.sources = sources

    def describe(self) -> list[Any]:
        return []  # (families are known only at scrape time)

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        grouped: dict[str, list[Sample]] = {}
        for source in self.sources:
            for sample in source():
                grouped.setdefault(sample.name, []).append(sample)
        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
                 "histogram": HistogramMetricFamily}
        for name, samples in grouped.items():
            first = samples[0]
            labels = [k for k, _ in first.labels]
            family = kinds[first.kind](name, first.help, labels=labels)
            for s in samples:
                values = [v for _, v in s.labels]
                if s.kind == "histogram":
                    buckets, total = s.value
                    family.add_metric(values, [(_le(b), n) for b, n in buckets], total)
                else:
                    family.add_metric(values, s.value)
            yield family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
