"""Silence inside the agent's replies: every clip of ../shared/data/speech played as a call on the
embedded defaults, each clip under each setting of ``[agent] max_second_chunk_words`` in turn
(the order alternating from clip to clip, so both see the same machine), the call going on
until the agent's last reply has played out.

The TTS speaks a reply a chunk at a time; the first chunk is a word or two (~0.5 s of audio) so
that the caller hears the agent sooner, and the next chunk's audio must arrive before that has
played. For every chunk after a reply's first this records how much agent audio was still
queued when its audio arrived (``ahead_ms``; negative: the caller heard that long a silence
first, a gap). Printed per setting: turns, later chunks, gaps (count, total, longest), the
5th/10th/50th percentile of the second chunk's ``ahead_ms``, later chunks that came with under
200 ms to spare, and voice-to-voice p50/p95 (the first audio is the first chunk's, so the
setting should not move it; also paired per turn against the first setting). Latencies are
wall-clock inside the process, in real time (``--fast`` skips only quiet stretches).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emit import emit  # noqa: E402
from voice_turn import (  # noqa: E402
    DATA,
    mode_config,
    mode_models,
    percentiles,
    speech_set,
    warm_models,
)

from agent.audio import read_audio  # noqa: E402
from agent.config import Config, add_config_flags, config_from_args  # noqa: E402
from agent.frames import SAMPLE_RATE  # noqa: E402
from agent.playout import Playout  # noqa: E402
from agent.presets import new_session  # noqa: E402
from agent.runtime import limit_blas_threads  # noqa: E402

MS = SAMPLE_RATE / 1000
SHORT_MS = 200  # a later chunk whose audio came with less than this queued: a near miss


class ChunkWatch:
    """Wraps one session's playout: for each text after the first of a reply, the audio queued
    (ms; negative: the silence before it) when its first audio arrived."""

    def __init__(self, playout: Playout) -> None:
        self.playout = playout
        self.rows: list[dict[str, Any]] = []
        self._index: dict[int, int] = {}  # reply -> texts begun
        self._pending: tuple[int, int, str] | None = None
        begin, write = playout.begin_text, playout.write

        def begin_text(text: str, reply: int = 0) -> None:
            k = self._index.get(reply, 0)
            self._index[reply] = k + 1
            self._pending = (reply, k, text)
            begin(text, reply)

        def write_(pcm: np.ndarray, last: bool = False) -> None:
            if self._pending is not None and len(pcm):
                reply, k, text = self._pending
                self._pending = None
                if k >= 1 and reply:
                    self.rows.append({"index": k, "words": len(text.split()),
                                      "ahead_ms": round(self.playout.lead_samples(reply) / MS)})
            write(pcm, last)

        playout.begin_text, playout.write = begin_text, write_


async def run_clip(cfg: Config, models: Any, pcm: np.ndarray) -> dict[str, Any]:
    from transports.file import FileCall

    turns: list[dict[str, Any]] = []
    session = new_session(cfg, models)
    session.trace.listeners.append(turns.append)
    watch = ChunkWatch(session.playout)
    async with session:
        await FileCall(pcm, fast=True, tail_s=30.0).run(session)
    v2v = [t["spans"]["voice_to_voice"]["ms"] for t in turns
           if t.get("type") == "turn" and t.get("complete") and "voice_to_voice" in t["spans"]]
    return {"v2v_ms": v2v, "chunks": watch.rows,
            "gaps": session.playout.gaps, "gap_ms": session.playout.gap_samples / MS}


def pct(xs: list[float], p: float) -> float | None:
    return float(np.percentile(xs, p)) if xs else None


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    later = [c for r in runs for c in r["chunks"]]
    second = [c["ahead_ms"] for c in later if c["index"] == 1]
    gaps = [c["ahead_ms"] for c in later if c["ahead_ms"] < 0]
    v2v = [x for r in runs for x in r["v2v_ms"]]
    return {
        "clips": len(runs), "turns": len(v2v), "later_chunks": len(later),
        "gaps": sum(r["gaps"] for r in runs), "gap_ms": round(sum(r["gap_ms"] for r in runs)),
        "longest_gap_ms": -min(gaps) if gaps else 0,
        "second_chunk_words_p50": statistics.median([c["words"] for c in later if c["index"] == 1])
        if second else None,
        "second_ahead_ms": {f"p{p}": pct(second, p) for p in (5, 10, 50)},
        f"under_{SHORT_MS}_ms": sum(1 for c in later if c["ahead_ms"] < SHORT_MS),
        "v2v_ms": percentiles(v2v) if v2v else {"n": 0, "p50": None, "p95": None},
    }


async def main_async(args: argparse.Namespace, base: Config) -> dict[str, Any]:
    manifest = speech_set(limit=args.limit)
    models = warm_models(base)
    limit_blas_threads(base.runtime)
    setups = {}
    for n in args.second:
        cfg = mode_config(base, "semantic")
        cfg.agent.max_second_chunk_words = n
        setups[n] = (cfg, mode_models(models, cfg))  # each its own TTS phrase cache, cold
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in setups}
    paired: dict[int, list[float]] = {n: [] for n in setups}
    k = 0
    total = args.rounds * len(manifest)
    for _ in range(args.rounds):
        for m in manifest:
            pcm = read_audio(DATA / m["path"])
            order = list(setups) if k % 2 == 0 else list(setups)[::-1]
            k += 1
            got = {}
            for n in order:
                cfg, mm = setups[n]
                r = await run_clip(cfg, mm, pcm)
                r["id"] = m["id"]
                runs[n].append(r)
                got[n] = r["v2v_ms"]
            first = args.second[0]
            for n in setups:
                if len(got[n]) == len(got[first]):  # the same turns (none split otherwise)
                    paired[n] += [b - a for a, b in zip(got[first], got[n], strict=True)]
            print(f"[{k:>3}/{total}] {m['id']:<44} " + "  ".join(
                f"{n}: gaps {runs[n][-1]['gaps']} ({runs[n][-1]['gap_ms']:.0f} ms), "
                f"v2v {', '.join(f'{x:.0f}' for x in runs[n][-1]['v2v_ms']) or '-'}"
                for n in setups), flush=True)
    res: dict[str, Any] = {"benchmark": "reply_gaps", "clips": len(manifest),
                           "rounds": args.rounds, "settings": {}}
    for n in setups:
        s = summary(runs[n])
        d = paired[n]
        s["v2v_paired_ms"] = ({"median": statistics.median(d), "turns": len(d),
                               "faster_share": round(sum(x < 0 for x in d) / len(d), 2)}
                              if d and n != args.second[0] else None)
        s["per_clip"] = [{"id": r["id"], "gaps": r["gaps"], "gap_ms": round(r["gap_ms"]),
                          "chunks": r["chunks"], "v2v_ms": r["v2v_ms"]} for r in runs[n]]
        res["settings"][str(n)] = s
    return res


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def print_table(res: dict[str, Any]) -> None:
    print(f"\n{'max_second_chunk_words':>22} {'turns':>6} {'later':>6} {'gaps':>5} {'gap ms':>7} "
          f"{'longest':>8} {'2nd p5':>7} {'2nd p10':>8} {'2nd p50':>8} {f'<{SHORT_MS} ms':>8} "
          f"{'v2v p50':>8} {'v2v p95':>8} {'paired':>7}")
    for n, s in res["settings"].items():
        a = s["second_ahead_ms"]
        paired = s["v2v_paired_ms"]
        print(f"{n:>22} {s['turns']:>6} {s['later_chunks']:>6} {s['gaps']:>5} {s['gap_ms']:>7} "
              f"{s['longest_gap_ms']:>8} {_ms(a['p5']):>7} {_ms(a['p10']):>8} {_ms(a['p50']):>8} "
              f"{s[f'under_{SHORT_MS}_ms']:>8} {_ms(s['v2v_ms']['p50']):>8} {_ms(s['v2v_ms']['p95']):>8} "
              f"{'-' if paired is None else format(paired['median'], '+.0f'):>7}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--second", nargs="+", type=int, default=[0, 8],
                    help="settings of [agent] max_second_chunk_words to compare (the first is "
                         "the reference of the paired v2v)")
    ap.add_argument("--rounds", type=int, default=2, help="times through the speech set")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--json-out")
    add_config_flags(ap)
    args = ap.parse_args()
    res = asyncio.run(main_async(args, config_from_args(args)))
    print_table(res)
    lean = {**res, "settings": {n: {k: v for k, v in s.items() if k != "per_clip"}
                                for n, s in res["settings"].items()}}
    emit(res, args.json_out, line=lean)
    return 0


if __name__ == "__main__":
    sys.exit(main())
