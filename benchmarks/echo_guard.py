"""The echo guard on whole calls: the real pipeline on the embedded models, whose caller channel
carries the agent's own voice back — 40–150 ms late, through a synthetic room response (0.2 s
of decaying noise), 6 dB under the agent (tests/echo_line.py) — guard on and off side by side.

Two kinds of call, each paced in real time and driven like ``voxline run`` (one agent frame
pulled per caller frame, as transports/file.py does), with the agent's played audio mixed back
into the caller's input as it plays (after barge-in cuts, silence while the agent is quiet):

- *echo only*: the caller says nothing; the agent speaks its greeting. Any ``Interrupt`` is a
  self-interruption (goal: 0 with the guard); tentative pauses (``PausePlayout``) are counted too.
  The guard's running ERLE over the call (goal >= 20 dB) and its CPU cost per 20 ms frame.
- *barge-in*: a real caller (LibriSpeech clips, scaled to the agent's level, so the echo is
  6 dB under the caller) talks over the greeting 2 s after it starts; it counts when an
  ``Interrupt`` comes within 2 s of the caller's first syllable and none came before it (goal:
  >= 95% with the guard, over the echo). The same barge-ins on a line without echo (a headset)
  with the guard on and off show what the canceller costs the caller's words there: AEC3
  holds a caller back while the agent speaks until it has learnt the line has no echo (about
  10 s of agent speech). WER is that of the caller's barge-in utterance (Whisper finals after
  the caller's first syllable, against the clip's reference).

    python benchmarks/echo_guard.py          # 8 echo-only calls per arm, 12 + 2 x 6 barge-ins
    python benchmarks/echo_guard.py --calls 4 --barge-ins 4 --clean-barge-ins 2

Prints a table and one JSON line; writes benchmarks/results/echo_guard.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from echo_line import EchoLine, room_response, to_int16  # noqa: E402
from emit import emit  # noqa: E402

from agent.audio import read_audio  # noqa: E402
from agent.config import Config, EchoConfig, add_config_flags, config_from_args  # noqa: E402
from agent.frames import FRAME_SAMPLES, SAMPLE_RATE, Interrupt, PausePlayout, Transcript  # noqa: E402
from agent.presets import load_models, new_session  # noqa: E402
from agent.runtime import freeze_after_warmup  # noqa: E402
from stages.asr.wer import corpus_wer  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
RESULT = ROOT / "benchmarks" / "results" / "echo_guard.json"
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
GREETINGS = [
    "Hello and thank you for calling the voxline demo line. I can help you with your account, "
    "your recent orders and our delivery options, so take your time and tell me what you need.",
    "Good afternoon, you have reached the support desk. Before we start, please have your order "
    "number ready, and let me know whether you are calling about a delivery or a refund today.",
    "Welcome back. Our opening hours have changed this month: we are now open from eight in the "
    "morning until eight in the evening, every day of the week except public holidays.",
]
CALLERS = [  # (clip id, different speakers from the agent's Piper voice)
    "ls-dev-clean-1988-24833-0000", "ls-dev-clean-2412-153948-0002", "ls-test-clean-61-70968-0000",
    "ls-test-clean-4507-16021-0012", "ls-dev-clean-1272-128104-0000", "ls-test-clean-2830-3980-0043",
]
CALLER_AFTER_S = 2.0  # the caller starts this long after the agent's first audio
BARGE_WINDOW_S = 2.0  # an Interrupt this soon after the caller's first syllable counts
NOISE_RMS = 10.0  # the line's noise floor (int16 RMS, -70 dBFS)


def onset(pcm: np.ndarray) -> int:
    """The first 20 ms frame louder than a tenth of the clip's loudest frame (in samples)."""
    frames = pcm[: len(pcm) // FRAME_SAMPLES * FRAME_SAMPLES].astype(np.float64)
    rms = np.sqrt(np.mean(frames.reshape(-1, FRAME_SAMPLES) ** 2, axis=1))
    return int(np.argmax(rms > 0.1 * rms.max())) * FRAME_SAMPLES


def active_rms(pcm: np.ndarray) -> float:
    x = pcm[: len(pcm) // FRAME_SAMPLES * FRAME_SAMPLES].astype(np.float64).reshape(-1, FRAME_SAMPLES)
    ms = np.mean(x * x, axis=1)
    return float(np.sqrt(np.mean(ms[ms > 0.01 * ms.max()]))) if ms.max() > 0 else 0.0


async def run_call(cfg: Config, models, *, guarded: bool, delay_ms: float | None, seed: int,
                   caller: np.ndarray | None = None, max_s: float = 14.0,
                   dump: Path | None = None) -> dict:
    """One call (``delay_ms`` None: a line without echo); the caller (if any) starts
    CALLER_AFTER_S after the agent's first audio."""
    call_cfg = dataclasses.replace(cfg, echo=EchoConfig(enabled="on" if guarded else "off",
                                                        delay_ms=cfg.echo.delay_ms))
    session = new_session(call_cfg, models)
    guard = session.echo
    cost_ns: list[int] = []
    heard_in: list[np.ndarray] = []  # with --dump: the caller's channel before and after the guard
    heard_out: list[np.ndarray] = []
    if guard is not None:
        process = guard.process

        def timed(pcm: np.ndarray) -> np.ndarray:
            t = time.perf_counter_ns()
            out = process(pcm)
            cost_ns.append(time.perf_counter_ns() - t)
            if dump is not None:
                heard_in.append(pcm.copy())
                heard_out.append(out.copy())
            return out

        guard.process = timed
    interrupts: list[int] = []  # media samples heard when each came
    pauses: list[int] = []
    finals: list[tuple[int, str]] = []  # (end in media samples, text)

    def watch(frame) -> None:  # noqa: ANN001
        if isinstance(frame, Interrupt):
            interrupts.append(session.offset)
        elif isinstance(frame, PausePlayout):
            pauses.append(session.offset)
        elif isinstance(frame, Transcript) and frame.final and frame.text.strip():
            finals.append((frame.end, frame.text.strip()))

    session.listen(watch, frozenset({Interrupt, PausePlayout, Transcript}))
    line = EchoLine(delay_ms or 0.0, room_response(seed, gain_db=-6.0 if delay_ms else -300.0))
    rng = np.random.default_rng(seed)
    silence = np.zeros(FRAME_SAMPLES)
    first_audio = caller_at = None  # frame indices
    played: list[np.ndarray] = []
    agent_track: list[np.ndarray] = []  # what the agent played, one frame per caller frame
    loop = asyncio.get_running_loop()
    async with session:
        t_next = loop.time()
        k = 0
        while k * FRAME_S < max_s:
            chunk = silence
            if caller_at is not None and k >= caller_at:
                i = (k - caller_at) * FRAME_SAMPLES
                part = caller[i : i + FRAME_SAMPLES]
                if len(part):
                    chunk = np.zeros(FRAME_SAMPLES)
                    chunk[: len(part)] = part
            noise = rng.standard_normal(FRAME_SAMPLES) * NOISE_RMS
            session.send_audio(to_int16(chunk + line.echo(FRAME_SAMPLES) + noise), time.monotonic_ns())
            out = session.playout.pull()
            line.played(out, FRAME_SAMPLES)
            if dump is not None:
                agent_track.append(np.zeros(FRAME_SAMPLES, np.int16) if out is None else out.copy())
            if out is not None:
                session.playout.sent()
                played.append(out.copy())
                if first_audio is None:
                    first_audio = k
                    if caller is not None:
                        caller_at = k + int(CALLER_AFTER_S / FRAME_S)
            k += 1
            done_caller = caller is None or (
                caller_at is not None and (k - caller_at) * FRAME_SAMPLES > len(caller) + SAMPLE_RATE)
            if first_audio is not None and done_caller and session.quiet:
                break
            t_next += FRAME_S
            await asyncio.sleep(max(0.0, t_next - loop.time()))
    if dump is not None and heard_in:
        from agent.audio import write_wav

        write_wav(dump, np.stack([np.concatenate(heard_in), np.concatenate(heard_out),
                                  np.concatenate(agent_track)], axis=1))
    result = {"guarded": guarded, "delay_ms": None if delay_ms is None else round(delay_ms, 1),
              "seed": seed, "interrupts_at_s": [round(at / SAMPLE_RATE, 2) for at in interrupts],
              "pauses_at_s": [round(at / SAMPLE_RATE, 2) for at in pauses],
              "seconds": round(k * FRAME_S, 2), "interrupts": len(interrupts), "pauses": len(pauses),
              "agent_s": round(sum(len(a) for a in played) / SAMPLE_RATE, 2),
              "agent_rms": round(active_rms(np.concatenate(played)), 1) if played else None}
    if guard is not None:
        result.update(erle_db=guard.erle_db, aec_frames=guard.frames, bypassed_frames=guard.bypassed,
                      realigns=guard.realigns,
                      us_per_frame=float(np.mean(cost_ns)) / 1e3 if cost_ns else None)
    if caller is not None:
        start = None if caller_at is None else caller_at * FRAME_SAMPLES + onset(caller)
        result["caller_onset_s"] = None if start is None else round(start / SAMPLE_RATE, 2)
        early = [at for at in interrupts if start is None or at < start]
        hit = [at for at in interrupts if start is not None
               and start <= at <= start + BARGE_WINDOW_S * SAMPLE_RATE]
        result["barge_in_ok"] = bool(hit) and not early
        result["barge_in_after_ms"] = round((hit[0] - start) / 16, 0) if hit else None
        result["heard"] = " ".join(t for end, t in finals if start is not None and end > start)
    return result


async def main_async(args: argparse.Namespace, cfg: Config) -> dict:
    t = time.monotonic()
    models = load_models(cfg)
    print(f"models loaded in {time.monotonic() - t:.1f} s", flush=True)
    freeze_after_warmup(cfg.runtime)
    delays = np.linspace(40.0, 150.0, max(args.calls, 1))
    echo_calls: dict[str, list[dict]] = {"off": [], "on": []}
    for i, delay in enumerate(delays):
        cfg.agent.greeting = GREETINGS[i % len(GREETINGS)]
        for arm in ("off", "on"):
            r = await run_call(cfg, models, guarded=arm == "on", delay_ms=float(delay), seed=i,
                               dump=args.dump and args.dump / f"echo-{arm}-{i}.wav")
            echo_calls[arm].append(r)
            erle = f"ERLE {r['erle_db']:5.1f} dB" if r.get("erle_db") is not None else ""
            print(f"echo only  guard {arm:<3} delay {delay:5.1f} ms: {r['interrupts']} interrupts, "
                  f"{r['pauses']} pauses, {r['seconds']:.1f} s {erle} at {r['interrupts_at_s']}", flush=True)
    manifest = {m["id"]: m for m in map(json.loads, (DATA / "manifest.jsonl").read_text().splitlines())}
    clips = [read_audio(DATA / "audio" / f"{c}.wav") for c in CALLERS]
    # the callers at the agent's level (as the agent played it): the echo is 6 dB under them
    levels = [c["agent_rms"] for c in echo_calls["on"] if c["agent_rms"]]
    caller_rms = args.caller_rms or (float(np.mean(levels)) if levels else 2000.0)
    arms = {"echo, guard on": (True, True, args.barge_ins),
            "no echo, guard on": (False, True, args.clean_barge_ins),
            "no echo, guard off": (False, False, args.clean_barge_ins)}
    barge: dict[str, list[dict]] = {}
    for name, (echo, guarded, n) in arms.items():
        barge[name] = []
        for i, delay in enumerate(np.linspace(40.0, 150.0, max(n, 1))[:n]):
            cfg.agent.greeting = GREETINGS[i % len(GREETINGS)]
            clip = clips[i % len(clips)].astype(np.float64)
            clip *= caller_rms / active_rms(clip)
            r = await run_call(cfg, models, guarded=guarded, delay_ms=float(delay) if echo else None,
                               seed=100 + i, caller=clip,
                               dump=args.dump and args.dump / f"barge-{name.replace(', ', '-').replace(' ', '')}-{i}.wav")
            r["caller"] = CALLERS[i % len(CALLERS)]
            barge[name].append(r)
            print(f"barge-in   {name:<19} delay {r['delay_ms'] or 0:5.1f} ms: "
                  f"{'ok' if r['barge_in_ok'] else 'MISSED'} after {r['barge_in_after_ms']} ms "
                  f"({r['interrupts']} interrupts); heard {r['heard']!r}", flush=True)

    def arm_summary(calls: list[dict]) -> dict:
        erles = [c["erle_db"] for c in calls if c.get("erle_db") is not None]
        costs = [c["us_per_frame"] for c in calls if c.get("us_per_frame") is not None]
        return {
            "calls": len(calls),
            "self_interruptions": sum(c["interrupts"] for c in calls),
            "calls_self_interrupted": sum(1 for c in calls if c["interrupts"]),
            "tentative_pauses": sum(c["pauses"] for c in calls),
            "erle_db_mean": float(np.mean(erles)) if erles else None,
            "erle_db_min": float(np.min(erles)) if erles else None,
            "us_per_20ms_frame": float(np.mean(costs)) if costs else None,
        }

    def barge_summary(calls: list[dict]) -> dict:
        ok = [b for b in calls if b["barge_in_ok"]]
        lat = [b["barge_in_after_ms"] for b in ok]
        pairs = [(manifest[b["caller"]]["text"], b["heard"]) for b in calls]
        return {"calls": len(calls), "interrupting": len(ok),
                "share": len(ok) / len(calls) if calls else None,
                "ms_p50": float(np.percentile(lat, 50)) if lat else None,
                "caller_wer": corpus_wer(pairs) if pairs else None}

    return {
        "benchmark": "echo_guard",
        "echo": "40-150 ms, 0.2 s decaying-noise room response, 6 dB under the agent",
        "asr": cfg.asr.backend, "llm": cfg.llm.backend, "tts": cfg.tts.backend,
        "turn_mode": cfg.turn.mode,
        "caller_rms": round(caller_rms, 1),
        "guard_off": arm_summary(echo_calls["off"]),
        "guard_on": arm_summary(echo_calls["on"]),
        "barge_in": {name: barge_summary(calls) for name, calls in barge.items() if calls},
        "calls": {"echo_only": echo_calls, "barge_in": barge},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=8, help="echo-only calls per arm (default 8)")
    ap.add_argument("--barge-ins", type=int, default=12,
                    help="barge-in calls over the echo, guard on (default 12)")
    ap.add_argument("--clean-barge-ins", type=int, default=6,
                    help="barge-in calls on a line without echo, guard on and off each (default 6)")
    ap.add_argument("--caller-rms", type=float, default=0.0,
                    help="the callers' speech level, int16 RMS while speaking (default: the "
                         "agent's as played, so the echo is 6 dB under the caller)")
    ap.add_argument("--json-out", default=str(RESULT))
    ap.add_argument("--dump", type=Path, metavar="DIR",
                    help="write each guarded call's caller channel before and after the guard and "
                         "the agent's played audio as a 3-channel WAV into DIR")
    add_config_flags(ap)
    args = ap.parse_args()
    cfg = config_from_args(args)
    res = asyncio.run(main_async(args, cfg))
    off, on = res["guard_off"], res["guard_on"]
    print(f"\n{'echo-only calls':<34}{'guard off':>12}{'guard on':>12}")
    print(f"{'calls':<34}{off['calls']:>12}{on['calls']:>12}")
    print(f"{'self-interruptions (goal 0)':<34}{off['self_interruptions']:>12}{on['self_interruptions']:>12}")
    print(f"{'calls self-interrupted':<34}{off['calls_self_interrupted']:>12}{on['calls_self_interrupted']:>12}")
    print(f"{'tentative pauses':<34}{off['tentative_pauses']:>12}{on['tentative_pauses']:>12}")
    if on["erle_db_mean"] is not None:
        print(f"{'ERLE dB mean / min (goal >= 20)':<34}{'-':>12}{on['erle_db_mean']:>7.1f} / {on['erle_db_min']:.1f}")
    if on["us_per_20ms_frame"] is not None:
        print(f"{'guard CPU per 20 ms frame':<34}{'-':>12}{on['us_per_20ms_frame']:>9.0f} us")
    for name, arm in res["barge_in"].items():
        wer = f"{arm['caller_wer']:.0%}" if arm["caller_wer"] is not None else "-"
        print(f"barge-ins, {name:<19}: {arm['interrupting']}/{arm['calls']} interrupt "
              f"({arm['share']:.0%}; goal >= 95% over the echo), p50 {arm['ms_p50']} ms after the "
              f"caller's first syllable; caller WER {wer}")
    emit(res, args.json_out, line={k: v for k, v in res.items() if k != "calls"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
