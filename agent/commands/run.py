"""``voxline run --input CALL.wav``: play a recording into the voice pipeline as a live call."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from agent.config import Config, add_config_flags, config_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="play a recording into the pipeline as a live call",
        description="Plays CALL (any common audio format) into VAD → ASR → turn → LLM → TTS in "
        "20 ms frames, prints transcripts and replies as they happen, and writes a stereo call "
        "recording (left: caller, right: agent) and the latency trace.",
    )
    p.add_argument("--input", "-i", required=True, metavar="CALL", help="the caller's audio")
    p.add_argument("--output", "-o", metavar="OUT.wav", help="stereo call recording to write")
    p.add_argument("--trace", metavar="TRACE.jsonl", help="latency trace to write (JSON lines)")
    p.add_argument(
        "--fast", action="store_true",
        help="skip quiet stretches; speech and turns still run in real time",
    )
    p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    p.add_argument("--tail", type=float, default=20.0, metavar="S",
                   help="how long the call may go on after the recording ends (default 20 s)")
    add_config_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agent import runtime

    cfg = config_from_args(args)
    if args.trace:
        cfg.trace.path = args.trace
    return runtime.run(_run(args, cfg), cfg.runtime)


class _Printer:
    """Prints the call as it happens: human lines, or one JSON event per line."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.t0 = time.monotonic_ns()
        self._last_partial = ""

    def emit(self, ev: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps(ev), flush=True)
            return
        kind = ev["type"]
        if kind == "transcript":
            if ev["final"]:
                if ev["text"].strip():
                    print(f"caller: {ev['text'].strip()}", flush=True)
            elif ev["text"] and ev["text"] != self._last_partial:
                self._last_partial = ev["text"]
                print(f"caller … {ev['text'].strip()}", flush=True)
        elif kind == "agent_text":
            tag = " (interrupted)" if ev["cancelled"] else ""
            print(f"agent{tag}: {ev['text'].strip()}", flush=True)
        elif kind == "agent_say" and ev.get("greeting"):
            print(f"agent (greeting): {ev['text']}", flush=True)
        elif kind == "interrupt":
            print(f"-- barge-in at {ev['at_s']:.2f} s", flush=True)
        elif kind == "error":
            print(f"error in {ev['stage'] or 'pipeline'}: {ev['message']}", file=sys.stderr)
        elif kind == "trace":
            spans = ev["spans"]
            main = spans.get("voice_to_voice") or spans.get("greeting")
            if main is None:
                return
            parts = ", ".join(f"{k} {v['ms']:.0f}" for k, v in spans.items()
                              if k not in ("voice_to_voice", "greeting"))
            over = [k for k, v in spans.items() if v["over"]]
            flag = f"  OVER BUDGET: {', '.join(over)}" if over else ""
            name = "greeting" if ev.get("kind") == "greeting" else "voice-to-voice"
            print(f"   [{name} {main['ms']:.0f} ms: {parts}]{flag}", flush=True)


async def play_call(
    cfg: Config, models: Any, pcm: Any, fast: bool, on_event: Any, tail_s: float = 20.0
) -> tuple[Any, dict[str, Any], bool]:
    """One call from a recording through a fresh session: (recording, summary, speech heard)."""
    from agent.events import EVENT_FRAMES, frame_event, trace_event
    from agent.presets import new_session
    from transports.file import FileCall

    session = new_session(cfg, models)
    trace = session.trace
    heard = False

    def on_frame(frame: Any) -> None:
        nonlocal heard
        ev = frame_event(frame, session.started_ns)
        if ev is not None:
            heard = heard or ev["type"] == "speech_started"
            on_event(ev)

    session.listen(on_frame, EVENT_FRAMES)
    trace.listeners.append(lambda rec: on_event(trace_event(rec)))
    async with session:
        rec = await FileCall(pcm, fast=fast, tail_s=tail_s).run(session)
    return rec, session.summary, heard


async def _run(args: argparse.Namespace, cfg: Config) -> int:
    from agent.audio import read_audio, write_wav
    from agent.errors import VoxlineError
    from agent.presets import load_models
    from agent.runtime import freeze_after_warmup

    pcm = read_audio(args.input)  # bad input fails before any model loads
    if args.output and not Path(args.output).parent.exists():
        raise VoxlineError(f"output folder does not exist: {Path(args.output).parent}")
    printer = _Printer(args.json)
    t_load = time.monotonic()
    models = load_models(cfg)
    freeze_after_warmup(cfg.runtime)
    if not args.json:
        print(f"models ready in {time.monotonic() - t_load:.1f} s "
              f"(asr {cfg.asr.backend}, llm {cfg.llm.backend}, tts {cfg.tts.backend}); "
              f"playing {len(pcm) / 16000:.1f} s of audio{' (fast)' if args.fast else ''}",
              flush=True)
    quiet_kinds = ("speech_started", "speech_stopped", "bot_started", "bot_stopped", "agent_delta")

    def on_event(ev: dict[str, Any]) -> None:
        if args.json or ev["type"] not in quiet_kinds:
            printer.emit(ev)

    rec, summary, heard = await play_call(cfg, models, pcm, args.fast, on_event, args.tail)
    if args.output:
        write_wav(args.output, rec.stereo())
    if args.json:
        print(json.dumps({**summary, "type": "summary",
                          "fast_forwarded_s": round(rec.fast_forwarded_s, 2)}), flush=True)
    else:
        print(f"{summary['turns']} turns; budget violations: {summary['violations'] or 'none'}"
              + (f"; recording: {args.output}" if args.output else "")
              + (f"; trace: {cfg.trace.path}" if cfg.trace.path else ""))
    if not heard:
        print(f"voxline: error: no speech detected in {args.input}", file=sys.stderr)
        return 3
    return 0
