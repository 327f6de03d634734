"""Whole voice turns on the embedded defaults: every clip of ../shared/data/speech played as a
call (``voxline run --fast`` semantics, in one process so models load once), then per-span
p50/p95 over all turns and the WER of the ASR finals against the manifest's references.

Latencies are wall-clock (time.monotonic_ns) inside the voxline process: from the arrival of the
caller's last speech frame to the first agent audio frame handed to the transport. ``--fast``
only skips quiet stretches; each turn runs in real time. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402

from agent.audio import read_audio  # noqa: E402
from agent.commands.run import play_call  # noqa: E402
from agent.config import Config, add_config_flags, config_from_args  # noqa: E402
from agent.presets import load_models  # noqa: E402
from agent.runtime import freeze_after_warmup  # noqa: E402
from stages.asr.wer import corpus_wer, normalize  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
SPANS = ["vad_eos", "asr_final", "llm_first_token", "tts_first_audio", "transport_send",
         "voice_to_voice", "partial_lag"]


async def run_clip(cfg: Config, models, path: Path) -> dict:
    finals: list[str] = []
    turns: list[dict] = []

    def on_event(ev: dict) -> None:
        if ev["type"] == "transcript" and ev["final"] and ev["text"].strip():
            finals.append(ev["text"].strip())
        elif ev["type"] == "trace":
            turns.append(ev)

    pcm = read_audio(path)
    t0 = time.monotonic()
    _, summary, _ = await play_call(cfg, models, pcm, True, on_event, tail_s=15.0)
    return {"finals": finals, "turns": turns, "partial_lag_ms": summary.get("partial_lag_ms", []),
            "wall_s": time.monotonic() - t0}


async def main_async(args: argparse.Namespace, cfg: Config) -> dict:
    manifest = [json.loads(x) for x in (DATA / "manifest.jsonl").read_text().splitlines() if x.strip()]
    if args.only:
        manifest = [m for m in manifest if m["id"].startswith(args.only)]
    if args.limit:
        manifest = manifest[: args.limit]
    t = time.monotonic()
    models = load_models(cfg)
    print(f"models loaded in {time.monotonic() - t:.1f} s", flush=True)
    freeze_after_warmup(cfg.runtime)
    spans: dict[str, list[float]] = {s: [] for s in SPANS}
    pairs_ls, pairs_all = [], []
    per_clip = []
    for i, m in enumerate(manifest, 1):
        r = await run_clip(cfg, models, DATA / m["path"])
        hyp = " ".join(r["finals"])
        pairs_all.append((m["text"], hyp))
        if m["id"].startswith("ls-"):
            pairs_ls.append((m["text"], hyp))
        for turn in r["turns"]:
            if turn.get("complete") and turn["kind"] == "turn":
                for k, v in turn["spans"].items():
                    spans.setdefault(k, []).append(v["ms"])
        spans["partial_lag"].extend(r["partial_lag_ms"])
        v2v = [t["spans"]["voice_to_voice"]["ms"] for t in r["turns"]
               if t.get("complete") and "voice_to_voice" in t["spans"]]
        clip_wer = corpus_wer([(m["text"], hyp)])
        per_clip.append({"id": m["id"], "wer": clip_wer, "v2v_ms": v2v, "wall_s": round(r["wall_s"], 2)})
        print(f"[{i:>2}/{len(manifest)}] {m['id']:<44} WER {clip_wer:6.1%}  "
              f"v2v {', '.join(f'{x:.0f}' for x in v2v) or '-':<20} {r['wall_s']:.1f} s", flush=True)
    table = {}
    for k, xs in spans.items():
        if xs:
            a = np.asarray(xs)
            table[k] = {"n": len(xs), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95))}
    return {
        "benchmark": "voice_turn",
        "clips": len(manifest),
        "asr": cfg.asr.backend, "llm": cfg.llm.backend, "tts": cfg.tts.backend,
        "wer_librispeech": corpus_wer(pairs_ls) if pairs_ls else None,
        "wer_all": corpus_wer(pairs_all),
        "ref_words_librispeech": sum(len(normalize(r)) for r, _ in pairs_ls),
        "spans_ms": table,
        "per_clip": per_clip,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", help="clip id prefix, e.g. ls-")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--json-out")
    add_config_flags(ap)
    args = ap.parse_args()
    cfg = config_from_args(args)
    res = asyncio.run(main_async(args, cfg))
    print(f"\n{'span':<18}{'n':>5}{'p50 ms':>10}{'p95 ms':>10}")
    for k, v in res["spans_ms"].items():
        print(f"{k:<18}{v['n']:>5}{v['p50']:>10.1f}{v['p95']:>10.1f}")
    wl = res["wer_librispeech"]
    print(f"WER LibriSpeech clips: {wl:.2%} ({res['ref_words_librispeech']} words)" if wl is not None else "")
    print(f"WER all clips: {res['wer_all']:.2%}")
    emit(res, args.json_out, line={k: v for k, v in res.items() if k != "per_clip"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
