"""Speaker-aware transcription on recordings of 2-5 speakers built from ../shared/data/speech,
side by side with plain transcription of the same recordings in one run.

Each recording is 6-10 utterances of different speakers of the speech set (a turn never follows
one of the same speaker), seeded, with 0.2-1.5 s of silence between them; the reference turns
are known from the construction: each utterance's voiced stretches (20-ms frames within 35 dB
of its loudest, pauses under 0.3 s bridged — the clips are clean recordings). Left out: the
whispered clips (the VAD hardly hears them: a VAD benchmark, not a speaker one), clips with
under 1.5 s of voice (single words: too little to tell a voice by), clips over 15 s (monologues
whose breathy pauses energy cannot tell from speech), and the real multi-speaker clip,
which is scored on its own: its reference has turns of words but no times, so it is scored by
speaker-attributed words (each reference word matched to a transcribed word in order, and the
speakers mapped one to one).

Measured: the diarization error rate (collar 0.25 s, NIST-style: missed speech + false alarm +
confusion over the scored reference speech, the best one-to-one speaker mapping), how often the
speaker count is right, and RTFx — audio seconds per wall second, after the models load — of
(a) plain transcription (``transcribe_files``, the ``voxline transcribe`` path) and (b) the
same with word times plus diarization (the ``voxline transcribe --diarize`` path), both over all
recordings, best of ``--repeat`` runs. ``--long-minutes 90`` also runs ``voxline transcribe
--diarize --json`` on one recording that long as a subprocess: wall time, the child's peak RSS
and when its first result line came.

Prints a table and one JSON line; ``--json-out`` writes the whole result.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from difflib import SequenceMatcher
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402

from agent.audio import int16_to_float, read_audio, write_wav  # noqa: E402
from agent.config import ASRConfig, VADConfig  # noqa: E402
from stages.asr.progressive import (  # noqa: E402
    PIECES_S,
    DiarizeWith,
    FileDone,
    transcribe_files,  # noqa: E402
    transcribe_progressively,
)
from stages.asr.sources import ArraySource  # noqa: E402
from stages.asr.speakers import assign_speakers  # noqa: E402
from stages.asr.wer import normalize  # noqa: E402
from stages.asr.whisper import WhisperBackend  # noqa: E402
from stages.speaker import der, diarize, load_embedder  # noqa: E402
from stages.vad import SileroModel  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
RATE = 16_000
FRAME = 320
TRIM_DB = 35.0  # a clip's voiced frames: within this of its loudest frame
MIN_PAUSE_S = 0.3  # a shorter pause inside an utterance is part of the speech
MIN_VOICED_S = 1.5  # an utterance has at least this much voice (a lone word is not a turn)
MAX_CLIP_S = 15.0  # longer clips are monologues with long, breathy pauses: not one utterance
SIZES = (2, 3, 4, 5)
LONG_VOICES = 4  # the --long-minutes recording's cast


def load_clips() -> tuple[dict[str, list[tuple[str, np.ndarray]]], dict | None]:
    """Usable clips by speaker, and the real multi-speaker clip's manifest entry."""
    by: dict[str, list[tuple[str, np.ndarray]]] = {}
    real = None
    for line in (DATA / "manifest.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m["kind"] == "multi-speaker":
            real = m
            continue
        if "whisper" in m["kind"] or m["duration_s"] > MAX_CLIP_S:
            continue
        pcm = read_audio(DATA / m["path"])
        if sum(b - a for a, b in voiced(pcm)) >= MIN_VOICED_S * RATE:
            by.setdefault(m["speaker"], []).append((m["id"], pcm))
    return by, real


def voiced(pcm: np.ndarray) -> list[tuple[int, int]]:
    """Where a clean clip is voiced, in samples: runs of 20-ms frames within TRIM_DB of its
    loudest frame (and over its own noise floor), pauses under MIN_PAUSE_S bridged."""
    n = len(pcm) // FRAME
    frames = pcm[: n * FRAME].astype(np.float64).reshape(n, FRAME)
    db = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-9)
    loud = db > max(db.max() - TRIM_DB, np.percentile(db, 10) + 10)
    runs: list[tuple[int, int]] = []
    for i in np.flatnonzero(loud):
        if runs and i - runs[-1][1] < MIN_PAUSE_S * RATE / FRAME:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return [(a * FRAME, b * FRAME) for a, b in runs]


def build(by: dict[str, list], k: int, seed: int) -> tuple[np.ndarray, list[tuple[float, float, str]]]:
    """One recording of ``k`` speakers and its reference turns (seconds)."""
    rng = random.Random(seed)
    speakers = rng.sample(sorted(by), k)
    turns = rng.randint(max(6, k), 10)
    order = speakers + [rng.choice(speakers) for _ in range(turns - k)]  # everyone speaks
    for _ in range(1000):  # a turn never follows one of the same speaker
        rng.shuffle(order)
        if all(a != b for a, b in zip(order, order[1:], strict=False)):
            break
    parts: list[np.ndarray] = []
    ref: list[tuple[float, float, str]] = []
    at = 0
    for who in order:
        gap = np.zeros(int(rng.uniform(0.2, 1.5) * RATE), np.int16)
        _, clip = rng.choice(by[who])
        parts += [gap, clip]
        at += len(gap)
        ref += [((at + a) / RATE, (at + b) / RATE, who) for a, b in voiced(clip)]
        at += len(clip)
    parts.append(np.zeros(RATE // 2, np.int16))
    return np.concatenate(parts), ref


def attributed_words(ref_turns: list[dict], segments: list) -> dict:
    """The real clip: reference words matched in order to transcribed words, and the share of
    them on the hypothesis speaker mapped to their reference speaker (one to one)."""
    ref = [(w, t["speaker"]) for t in ref_turns for w in normalize(t["text"])]
    hyp = [(w, s.speaker) for s in segments for w in normalize(s.text)]
    blocks = SequenceMatcher(a=[w for w, _ in ref], b=[w for w, _ in hyp], autojunk=False)
    pairs = [(ref[i + j][1], hyp[k + j][1]) for i, k, n in blocks.get_matching_blocks()
             for j in range(n)]
    rs, hs = sorted({r for _, r in ref}), sorted({h for _, h in hyp})
    counts = np.zeros((len(rs), max(len(hs), 1)))
    for r, h in pairs:
        counts[rs.index(r), hs.index(h)] += 1
    rows, cols = linear_sum_assignment(-counts)
    right = counts[rows, cols].sum()
    return {"reference_words": len(ref), "matched_words": len(pairs),
            "attributed_right": round(float(right / max(len(ref), 1)), 3),
            "speakers_found": len(hs), "speakers": len(rs)}


def _watch_peak(proc: subprocess.Popen, peak: list[int]) -> None:
    """The child's own peak RSS (VmHWM, kB) until it ends. (getrusage's children's maximum
    would count the pages of this process that the fork copied before the exec.)"""
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak[0] = max(peak[0], int(line.split()[1]))
        except OSError:
            return
        time.sleep(0.2)


def run_long(minutes: float, by: dict[str, list], threads: int) -> dict:
    """``voxline transcribe --diarize --json`` on one recording ``minutes`` long: wall time,
    peak RSS, when the first segment line came, and the DER of the RTTM it wrote (segments:
    each from its first word to its last, so pauses inside one count as speech)."""
    # a long meeting: four voices throughout (seeded), three of them in each ~minute
    cast = {v: by[v] for v in random.Random(90).sample(sorted(by), LONG_VOICES)}
    pieces, refs, total, seed = [], [], 0, 0
    while total < minutes * 60 * RATE:
        pcm, ref = build(cast, 3, 10_000 + seed)
        pieces.append(pcm)
        refs += [(a + total / RATE, b + total / RATE, f"{seed}:{who}") for a, b, who in ref]
        total += len(pcm)
        seed += 1
    end_s = minutes * 60
    refs = [(a, min(b, end_s), who) for a, b, who in refs if a < end_s]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.wav"
        write_wav(path, np.concatenate(pieces)[: int(minutes * 60 * RATE)])
        del pieces
        cmd = [sys.executable, "-m", "agent.cli", "transcribe", str(path), "--diarize", "--json",
               "--format", "rttm", "--asr-threads", str(threads)]
        print(f"long: {minutes:.0f} min, {' '.join(cmd[2:])}", file=sys.stderr)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        peak = [0]
        threading.Thread(target=_watch_peak, args=(proc, peak), daemon=True).start()
        first = None
        lines = 0
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("{"):
                lines += 1
                if first is None:
                    first = time.monotonic() - t0
        err = proc.stderr.read()  # type: ignore[union-attr]
        rc = proc.wait()
        wall = time.monotonic() - t0
        rttm = path.with_suffix(".rttm").read_text() if path.with_suffix(".rttm").exists() else ""
    hyp = [(float(f[3]), float(f[3]) + float(f[4]), f[7])
           for f in (x.split() for x in rttm.splitlines())]
    # the same voice in two pieces is one speaker: the reference names voices
    ref_voices = [(a, b, who.split(":", 1)[1]) for a, b, who in refs]
    scored = der(ref_voices, hyp, collar=0.25) if hyp else None
    peak_mb = peak[0] / 1024
    return {"minutes": minutes, "rc": rc, "wall_s": round(wall, 1),
            "rtfx_with_load": round(minutes * 60 / wall, 1),
            "first_result_s": None if first is None else round(first, 1),
            "result_lines": lines, "peak_rss_mb": round(peak_mb),
            "der_segments": None if scored is None else round(scored.der, 3),
            "voices": len({w for _, _, w in ref_voices}),
            "speakers_found": len({h for _, _, h in hyp}),
            "summary": err.strip().splitlines()[-1:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-size", type=int, default=6, help="recordings per speaker count (2-5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--speaker-model", default="campplus")
    ap.add_argument("--long-minutes", type=float, default=0.0,
                    help="also transcribe one recording this long with diarization (e.g. 90)")
    ap.add_argument("--only-long", action="store_true", help="only the --long-minutes recording")
    ap.add_argument("--piece-s", type=float, default=0.0,
                    help="read every recording in pieces this long, the first clustering after "
                    "half of it (default: the command's 120/240/480 s, 60 s): how much online "
                    "diarization costs against clustering a whole recording at once")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    by, real = load_clips()
    if args.only_long:
        res = {"benchmark": "diarization", "long": run_long(args.long_minutes or 90, by, args.threads)}
        print(json.dumps(res))
        return 0
    recs = [(k, s, *build(by, k, 1000 * k + s)) for k in SIZES for s in range(args.per_size)]
    audios = [(f"{k}spk-{s}", int16_to_float(pcm)) for k, s, pcm, _ in recs]
    total = sum(len(a) for _, a in audios) / RATE
    print(f"{len(recs)} recordings, {total / 60:.1f} min, {len(by)} speakers to draw from",
          file=sys.stderr)
    cfg = ASRConfig(threads=args.threads)
    plain = WhisperBackend(cfg, max_batch=args.batch_size)
    timed = WhisperBackend(cfg, max_batch=args.batch_size, word_times=True)
    for b in (plain, timed):
        b.warmup()
    vad = SileroModel(VADConfig())
    emb = load_embedder(args.speaker_model, threads=args.threads)
    emb.embed([np.zeros(RATE * 3 // 2, np.float32)])  # warm

    def transcribed(backend: WhisperBackend) -> tuple[float, list]:
        t0 = time.perf_counter()
        out = transcribe_files(audios, backend, vad, batch_size=args.batch_size,
                               vad_threads=args.threads)
        return time.perf_counter() - t0, out

    pieces = (int(args.piece_s),) if args.piece_s else PIECES_S
    first_s = args.piece_s / 2 if args.piece_s else 60.0

    def diarized() -> tuple[float, list[list[tuple[float, float, int]]]]:
        """The ``voxline transcribe --diarize`` path: word times, online diarization."""
        t0 = time.perf_counter()
        done = [e for e in transcribe_progressively(
            [ArraySource(n, [a]) for n, a in audios], timed, vad, args.batch_size,
            diarize=DiarizeWith(emb, first_s=first_s), vad_threads=args.threads,
            pieces_s=pieces) if isinstance(e, FileDone)]
        done.sort(key=lambda d: d.index)  # (files finish in any order)
        return time.perf_counter() - t0, [d.turns or [] for d in done]

    best_plain = min(transcribed(plain)[0] for _ in range(args.repeat))
    best_timed = min(transcribed(timed)[0] for _ in range(args.repeat))  # word times, no speakers
    wall_all, turns = min((diarized() for _ in range(args.repeat)), key=lambda r: r[0])
    wall_asr = best_timed

    rows = []
    for (k, s, _, ref), t in zip(recs, turns, strict=True):
        d = der(ref, t, collar=0.25)
        rows.append({"speakers": k, "seed": s, "der": d.der, "miss": d.miss,
                     "false_alarm": d.false_alarm, "confusion": d.confusion,
                     "found": len({x[2] for x in t})})
    res: dict = {"benchmark": "diarization", "recordings": len(recs),
                 "audio_min": round(total / 60, 1), "threads": args.threads,
                 "speaker_model": args.speaker_model, "collar_s": 0.25,
                 "pieces_s": list(pieces), "first_clustering_s": first_s}
    by_size = {}
    for k in SIZES:
        mine = [r for r in rows if r["speakers"] == k]
        by_size[k] = {"der": float(np.mean([r["der"] for r in mine])),
                      "count_right": sum(r["found"] == k for r in mine), "of": len(mine)}
    res["der_mean"] = float(np.mean([r["der"] for r in rows]))
    res["der_max"] = float(np.max([r["der"] for r in rows]))
    res["parts"] = {p: float(np.mean([r[p] for r in rows])) for p in ("miss", "false_alarm", "confusion")}
    res["count_right"] = f"{sum(r['found'] == r['speakers'] for r in rows)}/{len(rows)}"
    res["by_size"] = by_size
    res["rtfx_plain"] = total / best_plain
    res["rtfx_diarized"] = total / wall_all
    res["diarize_share"] = (wall_all - wall_asr) / wall_all
    res["rows"] = rows
    if real is not None:
        a = int16_to_float(read_audio(DATA / real["path"]))
        (r,) = transcribe_files([("real", a)], timed, vad, vad_threads=args.threads)
        res["real_clip"] = attributed_words(real["turns"],
                                            assign_speakers(r.segments, diarize(a, r.speech, emb)))
    if args.long_minutes:
        res["long"] = run_long(args.long_minutes, by, args.threads)

    print(f"\n{len(recs)} recordings of 2-5 speakers, {total / 60:.1f} min; {args.threads} threads; "
          f"{args.speaker_model}; collar 0.25 s")
    print(f"{'speakers':>8} {'DER':>7} {'count right':>12}")
    for k, v in by_size.items():
        print(f"{k:>8} {v['der']:>7.1%} {v['count_right']:>7}/{v['of']}")
    p = res["parts"]
    print(f"{'all':>8} {res['der_mean']:>7.1%} {res['count_right']:>12}   (miss {p['miss']:.1%}, "
          f"false alarm {p['false_alarm']:.1%}, confusion {p['confusion']:.1%}; max {res['der_max']:.1%})")
    print(f"RTFx plain {res['rtfx_plain']:.1f} | with word times + diarization "
          f"{res['rtfx_diarized']:.1f} (diarization {res['diarize_share']:.0%} of it)")
    if "real_clip" in res:
        rc = res["real_clip"]
        print(f"real 3-speaker clip: {rc['speakers_found']} speakers found, "
              f"{rc['attributed_right']:.0%} of its words on the right speaker")
    if "long" in res:
        lg = res["long"]
        print(f"{lg['minutes']:.0f}-min recording: wall {lg['wall_s']} s (with model load), "
              f"peak RSS {lg['peak_rss_mb']} MB, first result after {lg['first_result_s']} s "
              f"({lg['result_lines']} lines); DER of its RTTM {lg['der_segments']} "
              f"({lg['speakers_found']} speakers found, {lg['voices']} voices)")
    line = {k: v for k, v in res.items() if k != "rows"}
    emit(res, args.json_out, line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
