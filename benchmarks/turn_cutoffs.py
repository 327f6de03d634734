"""Cut-offs against speed: how often endpointing ends a caller's turn inside a mid-sentence
pause, beside how fast it answers complete utterances, for VAD-only endpointing at several
silences and for semantic endpointing (the Smart Turn model), all in one run.

The set: clips of ../shared/data/speech with at least 6 words. For each, one word boundary in
the middle third of the sentence (not after punctuation; the shortest gap there, so the cut is
inside fluent speech) is found with faster-whisper's word timestamps (tiny.en, int8), the cut
placed at the quietest point between the two words and checked by reading each side alone
(``--set quiet``, ``word_boundaries``; ``--set times``: where the word times meet, the set
until 2026-12-06); a pause of 300-1,000 ms is inserted there, filled with the clip's own
quietest 100 ms (its noise floor), tiled. Boundaries are cached in
``benchmarks/results/turn_cutoff_set_quiet.json`` (``turn_cutoff_set.json`` for ``times``).

Cut-off: the turn detector ends the turn (``UserTurnEnded``) while the caller is inside the
inserted pause. That is stricter than "agent audio starts inside the pause": a turn that ends
there makes the agent answer over the caller whether its audio starts before or after the
caller goes on. The pause calls run VAD → ASR → turn detection only (real time, four calls at
once, sharing one ASR engine as calls do); voice-to-voice is measured on the complete clips
through the whole pipeline (``voice_turn.py``'s call, one at a time), from the caller's last
speech frame to the first agent audio frame handed to the transport. Prints a table and one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from emit import emit  # noqa: E402
from voice_turn import run_clip  # noqa: E402

from agent.audio import read_audio  # noqa: E402
from agent.config import Config, add_config_flags, config_from_args  # noqa: E402
from agent.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame, UserTurnEnded  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.presets import STAGES, load, load_models  # noqa: E402
from agent.runtime import freeze_after_warmup  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.trace import Trace  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
SETS = {  # which cut (``word_boundaries``): its cached boundaries
    "quiet": ROOT / "benchmarks" / "results" / "turn_cutoff_set_quiet.json",
    "times": ROOT / "benchmarks" / "results" / "turn_cutoff_set.json",
}
PAUSES_MS = (300, 500, 700, 1000)
MIN_WORDS = 6


def word_boundaries(manifest: list[dict], kind: str = "quiet") -> dict[str, dict]:
    """Per clip: the chosen boundary (sample) and its words, from Whisper word timestamps.

    The candidates are the boundaries in the middle third of the sentence not after
    punctuation, the shortest gap first (fluent speech). ``times`` takes the first and cuts
    where tiny.en's times for the two words meet (the set of 2026-12-03 to 06). Those times are
    coarse: in about half the clips that point lies inside a vowel, so the pause split a word
    ("affected He|ster", "a love|ly") and the ASR read half a word as a whole one. ``quiet``
    cuts at the quietest 20 ms within 120 ms of the meeting point (inside the two words'
    span), and keeps a candidate only where Whisper, reading the audio on each side alone,
    ends with the first word and starts with the second; else it tries the next candidate,
    and a clip with none passing is left out."""
    set_file = SETS[kind]
    if set_file.is_file():
        cached = json.loads(set_file.read_text())
        if all(m["id"] in cached for m in manifest):
            return cached
    from faster_whisper import WhisperModel

    from stages.asr.whisper import embedded_model_dir

    model = WhisperModel(str(embedded_model_dir()), device="cpu", compute_type="int8", cpu_threads=2)

    def read(pcm: np.ndarray, word_times: bool = False) -> list:
        segs, _ = model.transcribe(pcm.astype(np.float32) / 32768, language="en", beam_size=1,
                                   word_timestamps=word_times, vad_filter=False)
        return list(segs)

    out: dict[str, dict] = {}
    for i, m in enumerate(manifest, 1):
        pcm = read_audio(DATA / m["path"])
        words = [w for s in read(pcm, word_times=True) for w in (s.words or [])]
        entry: dict = {"words": len(words), "boundary": None}
        if len(words) >= MIN_WORDS:
            lo, hi = len(words) // 3, max(len(words) // 3 + 1, 2 * len(words) // 3)
            options = sorted(
                (words[k + 1].start - words[k].end, k) for k in range(lo, min(hi, len(words) - 1))
                if not words[k].word.strip().endswith((".", "?", "!", ",", ";", ":")))
            if kind == "times":
                options = options[:1]
            for rank, (_, k) in enumerate(options):
                w0, w1 = words[k], words[k + 1]
                if kind == "times":
                    cut, level = int((w0.end + w1.start) / 2 * SAMPLE_RATE), None
                else:
                    cut, level = quiet_cut(pcm, w0, w1)
                    left = tokens(" ".join(s.text for s in read(pcm[:cut])))
                    right = tokens(" ".join(s.text for s in read(pcm[cut:])))
                    if left[-1:] != tokens(w0.word)[-1:] or right[:1] != tokens(w1.word)[:1]:
                        continue
                entry.update(boundary=cut, before=w0.word.strip(), after=w1.word.strip(),
                             level_db=level, rank=rank)
                break
        out[m["id"]] = entry
        print(f"  words [{i}/{len(manifest)}] {m['id']}: {entry}", flush=True)
    set_file.write_text(json.dumps(out, indent=1))
    return out


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower())


def window_power(pcm: np.ndarray, win: int, hop: int) -> np.ndarray:
    """Mean square of each ``win``-sample window of ``pcm``, window j starting at j * hop."""
    x = pcm.astype(np.float64)
    return np.convolve(x * x, np.ones(win), "valid")[::hop] / win


def quiet_cut(pcm: np.ndarray, w0, w1) -> tuple[int, float]:  # noqa: ANN001
    """The quietest 20 ms (10-ms steps) within 120 ms of where the two words' times meet,
    inside their span: its middle (sample) and its level in dB against the clip's loudest
    20 ms."""
    hop, win = SAMPLE_RATE // 100, SAMPLE_RATE // 50
    energy = window_power(pcm, win, hop)
    meet = (w0.end + w1.start) / 2
    first = max(meet - 0.12, w0.start + 0.05) * SAMPLE_RATE - win / 2
    last = min(meet + 0.12, w1.end - 0.05) * SAMPLE_RATE - win / 2
    js = np.arange(max(0, int(np.ceil(first / hop))), min(len(energy), int(last // hop) + 1))
    if not len(js):
        return int(meet * SAMPLE_RATE), 0.0
    j = int(js[np.argmin(energy[js])])
    level = 10 * np.log10((energy[j] + 1.0) / (energy.max() + 1.0))
    return j * hop + win // 2, round(float(level), 1)


def noise_floor(pcm: np.ndarray, n: int) -> np.ndarray:
    """``n`` samples of the clip's quietest 100 ms, tiled: a pause at the line's own noise."""
    w = SAMPLE_RATE // 10
    if len(pcm) < 2 * w:
        return np.zeros(n, np.int16)
    start = int(np.argmin(window_power(pcm, w, w // 4))) * (w // 4)
    quiet = pcm[start:start + w]
    return np.resize(quiet, n).astype(np.int16)


def with_pause(pcm: np.ndarray, at: int, ms: int) -> tuple[np.ndarray, int, int]:
    n = ms * SAMPLE_RATE // 1000
    out = np.concatenate([pcm[:at], noise_floor(pcm, n), pcm[at:]])
    return out, at, at + n


async def pause_call(cfg: Config, models, pcm: np.ndarray, lo: int, hi: int) -> dict:
    """One call with an inserted pause through VAD → ASR → turn; where its turns ended, and
    for a cut-off, how far into the pause and on what words."""
    from transports.file import FileCall

    vad_cfg = cfg.vad
    scorer = models.turn if cfg.turn.mode == "semantic" else None
    if scorer is not None:  # as build_pipeline does: the VAD stops at the short pause
        vad_cfg = dataclasses.replace(vad_cfg, stop_ms=min(vad_cfg.stop_ms, cfg.turn.pause_ms))
    stages = [
        load(STAGES["vad"])(vad_cfg, model=models.vad.fork()),
        load(STAGES["asr"])(models.asr, cfg.asr),
        load(STAGES["turn"])(cfg.turn, vad_stop_ms=vad_cfg.stop_ms, scorer=scorer,
                             text_scorer=models.turn_words),
    ]
    session = Session(Pipeline(stages), Trace())
    ended: list[tuple[int, str]] = []  # each turn's end (media sample) and words

    def on(frame: Frame) -> None:
        if isinstance(frame, UserTurnEnded):
            ended.append((session.offset, frame.text))

    session.listen(on, frozenset({UserTurnEnded}))
    async with session:
        await FileCall(pcm, fast=True, tail_s=3.0).run(session)
    inside = [(e, t) for e, t in ended if lo < e <= hi + FRAME_SAMPLES]
    out: dict = {"ends": [e for e, _ in ended], "cut_off": bool(inside)}
    if inside:
        out["cut_at_ms"] = round((inside[0][0] - lo) * 1000 / SAMPLE_RATE)
        out["cut_text"] = inside[0][1]
    return out


def config_for(base: Config, name: str) -> Config:
    """``vad-MS`` (a fixed silence), ``semantic`` (the turn model alone), ``words`` (the turn
    model and the words model, ``turn.text_check``: the defaults) or ``words-MS`` (that, with
    ``text_wait_ms``), ``words-unsure`` (no early end on sure words), ``words-long`` (no
    lower threshold for short turns; with words-unsure: the words' check of 2026-12-03) or
    ``words-nonear`` (words just short of their threshold wait the full ``text_wait_ms``, as
    before 2026-12-05), ``words-noasrend`` (the ASR's P(a sentence ends) not read,
    ``turn.text_asr_end`` 0, as before 2026-12-06), ``words-asrendNN`` (``text_asr_end`` NN/100),
    ``words-noasrsure`` (an end the ASR is sure of does not outweigh the words,
    ``turn.text_asr_sure`` 2, as before 2026-12-06's fourth session), ``words-early`` (the
    turn model's first look at Silero's pause, ``turn.ask_at_pause``),
    ``wait-MS`` (the defaults with ``max_wait_ms`` and ``text_wait_ms``
    both MS: what a shorter wait for an unfinished-sounding caller costs in cut-offs)."""
    cfg = copy.deepcopy(base)
    if not (name == "semantic" or name.startswith(("words", "wait-"))):
        cfg.turn.mode = "vad"
        cfg.turn.silence_ms = int(name.removeprefix("vad-"))
        return cfg
    cfg.turn.mode = "semantic"
    cfg.turn.text_check = name != "semantic"
    if name == "words-nonear":  # words just short of their threshold wait text_wait_ms
        cfg.turn.text_near_share = 2.0  # above the threshold itself: never
    elif name == "words-noasrend":  # the words' verdict whatever the ASR heard of the end
        cfg.turn.text_asr_end = 0.0
    elif name == "words-early":  # the turn model's first look at Silero's pause
        cfg.turn.ask_at_pause = True
    elif name == "words-noasrsure":  # the ASR's sure end does not outweigh the words
        cfg.turn.text_asr_sure = 2.0
    elif name.startswith("words-asrend"):  # the ASR's end read at NN/100 (words-asrend80)
        cfg.turn.text_asr_end = int(name.removeprefix("words-asrend")) / 100
    elif name == "words-unsure":
        cfg.turn.text_sure = 2.0  # P never reaches it
    elif name == "words-long":
        cfg.turn.text_short_words = 0
    elif name.startswith("wait-"):  # the defaults with every wait for more at most MS
        cfg.turn.max_wait_ms = cfg.turn.text_wait_ms = int(name.removeprefix("wait-"))
    elif name.startswith("words") and name != "words":
        cfg.turn.text_wait_ms = int(name.removeprefix("words-"))
    return cfg


async def main_async(args: argparse.Namespace, base: Config) -> dict:
    manifest = [json.loads(x) for x in (DATA / "manifest.jsonl").read_text().splitlines() if x.strip()]
    bounds = word_boundaries(manifest, args.set)
    items = []
    for m in manifest:
        b = bounds[m["id"]]
        if b.get("boundary"):
            pcm = read_audio(DATA / m["path"])
            for ms in args.pauses:
                items.append((m["id"], ms, *with_pause(pcm, b["boundary"], ms)))
    if args.limit:
        items = items[: args.limit * len(args.pauses)]
    complete = [m for m in manifest if bounds[m["id"]].get("boundary")][: args.v2v_clips]
    print(f"{len(items)} pause calls from {len(items) // len(args.pauses)} clips; "
          f"{len(complete)} complete clips for voice-to-voice", flush=True)
    t = time.monotonic()
    words = any(c.turn.mode == "semantic" and c.turn.text_check
                for c in (config_for(base, name) for name in args.configs))
    semantic = config_for(base, "words" if words else "semantic")
    models = load_models(semantic)
    print(f"models loaded in {time.monotonic() - t:.1f} s", flush=True)
    freeze_after_warmup(base.runtime)
    rows = []
    for name in args.configs:
        cfg = config_for(base, name)
        sem = asyncio.Semaphore(args.concurrency)
        done = 0

        async def one(item, cfg=cfg, sem=sem, name=name):  # noqa: ANN001, ANN202
            nonlocal done
            async with sem:
                r = await pause_call(cfg, models, item[2], item[3], item[4])
            done += 1
            if done % 10 == 0 or done == len(items):
                print(f"  {name}: pause calls {done}/{len(items)}", flush=True)
            return {"id": item[0], "pause_ms": item[1], **r}

        t = time.monotonic()
        results = await asyncio.gather(*(one(it) for it in items))
        pause_s = time.monotonic() - t
        v2v: list[float] = []
        for i, m in enumerate(complete, 1):
            r = await run_clip(cfg, models, DATA / m["path"])
            v2v += [x["spans"]["voice_to_voice"]["ms"] for x in r["turns"]
                    if x.get("complete") and x["kind"] == "turn" and "voice_to_voice" in x["spans"]]
            print(f"  {name}: v2v clip {i}/{len(complete)}", flush=True)
        by_pause = {ms: float(np.mean([r["cut_off"] for r in results if r["pause_ms"] == ms]))
                    for ms in args.pauses}
        row = {
            "config": name,
            "cutoff_rate": float(np.mean([r["cut_off"] for r in results])) if results else None,
            "cutoff_by_pause": by_pause,
            "calls": len(results),
            "v2v_p50_ms": float(np.percentile(v2v, 50)) if v2v else None,
            "v2v_p95_ms": float(np.percentile(v2v, 95)) if v2v else None,
            "v2v_turns": len(v2v),
            "pause_calls_s": round(pause_s, 1),
            # which calls were cut off: the turn's end, ms into the pause, and its words
            "cut": [{"id": r["id"], "pause_ms": r["pause_ms"], "at_ms": r["cut_at_ms"],
                     "text": r["cut_text"]} for r in results if r["cut_off"]],
        }
        rows.append(row)
        for c in row["cut"]:
            print(f"  {name}: cut off {c['id']} ({c['pause_ms']} ms pause) {c['at_ms']} ms in: "
                  f"{c['text']!r}", flush=True)
        print(json.dumps(row), flush=True)
    return {"benchmark": "turn_cutoffs", "set": args.set, "pauses_ms": list(args.pauses), "rows": rows,
            "rule": "cut-off: UserTurnEnded while the caller is inside the inserted pause; "
                    "v2v: last caller speech frame to first agent audio frame, complete clips"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["vad-300", "vad-500", "vad-700", "vad-1000", "semantic", "words"])
    ap.add_argument("--set", choices=sorted(SETS), default="quiet",
                    help="where the pause goes: the quietest point between the words, checked "
                         "(quiet), or where tiny.en's word times meet (times, the set until "
                         "2026-12-06)")
    ap.add_argument("--pauses", nargs="+", type=int, default=list(PAUSES_MS))
    ap.add_argument("--limit", type=int, help="clips for the pause calls")
    ap.add_argument("--v2v-clips", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--json-out")
    add_config_flags(ap)
    args = ap.parse_args()
    res = asyncio.run(main_async(args, config_from_args(args)))
    print(f"\n{'config':<12}{'cut-offs':>10}" + "".join(f"{f'@{p}ms':>9}" for p in args.pauses)
          + f"{'v2v p50':>10}{'v2v p95':>10}")
    for r in res["rows"]:
        cut = "".join(f"{r['cutoff_by_pause'][p]:>9.0%}" for p in args.pauses)
        print(f"{r['config']:<12}{r['cutoff_rate']:>10.1%}{cut}{r['v2v_p50_ms'] or 0:>10.0f}"
              f"{r['v2v_p95_ms'] or 0:>10.0f}")
    emit(res, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
