"""What OpenTelemetry export (agent/otel.py) costs: CPU per turn on the event loop's thread for
building a turn's spans (9 spans: the turn and 8 stage spans), over 20 calls of 100 synthetic
turns, with spans going through the batch processor to an in-memory exporter and to a real
OTLP/HTTP receiver in another process; and, with no exporter, the per-frame cost of a session
against one with the exporter watching (the observer hub adds nothing per frame).

Per-turn cost is the loop thread's CPU time (``time.thread_time_ns``) for the turns with the
exporter watching, minus the same turns with no observer. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emit import emit  # noqa: E402

from agent import observe  # noqa: E402
from agent.otel import OtelExporter  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.stage import Stage  # noqa: E402
from agent.trace import SPANS, Trace  # noqa: E402

EVENTS = ["vad_decision", "turn_model_request", "turn_model_result", "asr_final", "llm_request",
          "llm_first_token", "tts_request", "tts_first_audio", "audio_out"]
BUDGETS = {name: 1_000.0 for name in SPANS}
SPANS_PER_TURN = 1 + len(SPANS)

# an OTLP/HTTP receiver in its own process (so its CPU is not ours): counts spans, prints the count
RECEIVER = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest, ExportTraceServiceResponse)
    count = 0
    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            global count
            req = ExportTraceServiceRequest()
            req.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            count += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            body = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            body = str(count).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(srv.server_address[1], flush=True)
    srv.serve_forever(0.05)
    """
)


async def calls(n_calls: int, turns: int, between: Any = None) -> list[int]:
    """Run the calls; returns the loop thread's CPU ns for each call's turns."""
    out = []
    for _ in range(n_calls):
        async with Session(Pipeline([Stage()]), Trace(BUDGETS)) as session:
            trace = session.trace
            t = time.thread_time_ns()
            for _ in range(turns):
                trace.begin_turn(speech_end=time.monotonic_ns())
                for name in EVENTS:
                    trace.event(name)
            out.append(time.thread_time_ns() - t)
        if between is not None:
            between()  # outside the timing: let the batch thread catch up (its queue holds 2048)
    return out


def per_turn_us(samples: list[int], turns: int) -> float:
    return float(np.median(samples)) / turns / 1e3


def run_exporter(exporter: OtelExporter, n_calls: int, turns: int) -> tuple[float, float]:
    """(loop-thread µs per turn, whole-process CPU µs per turn incl. the batch thread)."""
    unwatch = observe.watch(exporter)
    cpu0 = time.process_time_ns()
    try:
        samples = asyncio.run(calls(n_calls, turns, lambda: exporter.force_flush()))
    finally:
        unwatch()
        exporter.shutdown()
    process = (time.process_time_ns() - cpu0) / (n_calls * turns) / 1e3
    return per_turn_us(samples, turns), process


def frame_cost(n: int) -> float:
    """µs of loop-thread CPU per 20 ms caller frame through a started session (one
    pass-through stage)."""
    pcm = np.zeros(320, np.int16)

    async def main() -> int:
        async with Session(Pipeline([Stage()])) as session:
            send = session.send_audio
            t = time.thread_time_ns()
            for _ in range(n):
                send(pcm)
            return time.thread_time_ns() - t

    return asyncio.run(main()) / n / 1e3


def frames_off_on(n: int, rounds: int = 5) -> tuple[float, float, int]:
    """Per-frame cost with no observer and with the exporter watching, alternated ``rounds``
    times (best of each, so the machine's load hits both alike), and how many times the
    observer hub was entered while the frames flowed (counted by wrapping its two entries)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    entries = 0
    started, ended = observe.call_started, observe.call_ended

    def counting(fn: Any) -> Any:
        def wrapper(*args: Any) -> None:
            nonlocal entries
            entries += 1
            fn(*args)
        return wrapper

    off, on = [], []
    exporter = OtelExporter(InMemorySpanExporter())
    observe.call_started, observe.call_ended = counting(started), counting(ended)
    try:
        for _ in range(rounds):
            off.append(frame_cost(n))
            unwatch = observe.watch(exporter)
            try:
                on.append(frame_cost(n))
            finally:
                unwatch()
    finally:
        observe.call_started, observe.call_ended = started, ended
        exporter.shutdown()
    calls = 2 * rounds
    return min(off), min(on), entries - 2 * calls  # each call enters the hub twice


def hub_cost_ns(n: int) -> float:
    """ns for observe.call_started + call_ended with no observer registered."""
    session = Session(Pipeline([Stage()]))
    t = time.perf_counter_ns()
    for _ in range(n):
        observe.call_started(session)
        observe.call_ended(session, {})
    return (time.perf_counter_ns() - t) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--turns", type=int, default=100, help="turns per call")
    ap.add_argument("--frames", type=int, default=20_000, help="frames per session run")
    ap.add_argument("--json-out", help="write the JSON result here too")
    args = ap.parse_args()
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert not observe.observers(), "the benchmark expects no observer registered"
    asyncio.run(calls(2, args.turns))  # warm-up
    base = per_turn_us(asyncio.run(calls(args.calls, args.turns)), args.turns)

    memory = InMemorySpanExporter()
    mem_loop, mem_proc = run_exporter(OtelExporter(memory), args.calls, args.turns)
    mem_spans = len(memory.get_finished_spans())

    recv = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(recv.stdout.readline())  # type: ignore[union-attr]
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{port}/v1/traces"
        os.environ.setdefault("NO_PROXY", "127.0.0.1")
        otlp_loop, otlp_proc = run_exporter(OtelExporter.from_env(), args.calls, args.turns)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as r:
            otlp_spans = int(r.read())
    finally:
        recv.terminate()
        recv.wait()

    frames_off, frames_on, hub_per_frame = frames_off_on(args.frames)
    hub_ns = hub_cost_ns(100_000)

    n_turns = args.calls * args.turns
    want_spans = n_turns * SPANS_PER_TURN + args.calls  # and one call span each
    result: dict[str, Any] = {
        "benchmark": "otel_overhead", "calls": args.calls, "turns": n_turns,
        "spans_per_turn": SPANS_PER_TURN,
        "trace_only_us_per_turn": base,
        "memory": {"loop_us_per_turn": mem_loop - base, "process_us_per_turn": mem_proc - base,
                   "spans": mem_spans, "expected_spans": want_spans},
        "otlp_http": {"loop_us_per_turn": otlp_loop - base, "process_us_per_turn": otlp_proc - base,
                      "spans_received": otlp_spans, "expected_spans": want_spans},
        "frame_us_no_observer": frames_off, "frame_us_exporter_watching": frames_on,
        "hub_entries_beyond_start_and_end": hub_per_frame,
        "hub_ns_per_call_no_observer": hub_ns,
    }
    print(f"{n_turns} turns in {args.calls} calls, {SPANS_PER_TURN} spans a turn; CPU time "
          f"beyond the trace alone ({base:.1f} µs a turn)")
    print(f"{'exporter':<26}{'loop µs/turn':>14}{'process µs/turn':>17}{'spans sent':>12}")
    print(f"{'in-memory (batch)':<26}{mem_loop - base:>14.1f}{mem_proc - base:>17.1f}"
          f"{mem_spans:>7}/{want_spans}")
    print(f"{'OTLP/HTTP (batch)':<26}{otlp_loop - base:>14.1f}{otlp_proc - base:>17.1f}"
          f"{otlp_spans:>7}/{want_spans}")
    print(f"per 20 ms frame through a session (best of 5, alternated): {frames_off:.2f} µs "
          f"with no observer, {frames_on:.2f} µs with the exporter watching")
    print(f"observer hub: entered {hub_per_frame} times beyond each call's start and end while "
          f"{10 * args.frames} frames flowed; {hub_ns:.0f} ns a call with none registered")
    emit(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
