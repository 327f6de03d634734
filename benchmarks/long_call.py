"""A 30-turn call through the real LLM stage and the local LLM (SmolLM2 on llama.cpp), the
caller's turns taken from the transcripts of ../shared/data/speech: the LLM's time to first
token per turn with each conversation's KV cache kept across turns (``warm``), and with the old
behaviour (a history sliding by one turn of six, llama.cpp's plain prefix match).

A flat time to first token is the aim: the bar is the median of the last 10 turns within 1.5x
that of the first 10. Times are wall-clock from the stage's ``llm_request`` to its
``llm_first_token`` event. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402

from agent.config import Config, add_config_flags, config_from_args  # noqa: E402
from agent.frames import Direction, Frame, LLMEnd, UserTurnEnded  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.stage import StageContext  # noqa: E402
from agent.trace import Trace  # noqa: E402
from stages.llm.chat import ChatHistory  # noqa: E402
from stages.llm.local import LocalLLM  # noqa: E402
from stages.llm.stage import LLMStage  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
OLD_HISTORY_TURNS = 6  # the default before the history dropped its old turns in blocks
BAR = 1.5


def caller_turns(n: int) -> list[str]:
    """``n`` short caller turns (2-25 words), the manifest's transcripts in order, repeated."""
    texts = []
    for line in (DATA / "manifest.jsonl").read_text().splitlines():
        text = " ".join(json.loads(line)["text"].split()) if line.strip() else ""
        if 2 <= len(text.split()) <= 25:
            text = text.lower() if text.isupper() else text
            texts.append(text[0].upper() + text[1:] + ("" if text[-1] in ".?!" else "."))
    return [texts[i % len(texts)] for i in range(n)]


def medians(ms: list[float]) -> dict[str, float]:
    first, last = statistics.median(ms[:10]), statistics.median(ms[-10:])
    return {"first10_p50_ms": round(first, 1), "last10_p50_ms": round(last, 1),
            "ratio": round(last / first, 2)}


async def run_long_call(cfg: Config, llm: LocalLLM, turns: int = 30, warm: bool = True) -> dict:
    """One call of ``turns`` caller turns through an :class:`LLMStage` on ``llm``; per turn the
    time to first token and how the prompt met the KV cache. ``warm=False``: the old behaviour.
    """
    agent = dataclasses.replace(cfg.agent, first_audio_wait_ms=0)  # no TTS here to wait for
    stage = LLMStage(llm, cfg.llm, agent)
    if not warm:
        stage.history = ChatHistory(cfg.llm.system_prompt, OLD_HISTORY_TURNS, OLD_HISTORY_TURNS)
    ended = asyncio.Event()

    def out(frame: Frame) -> None:
        if isinstance(frame, LLMEnd):
            ended.set()

    trace = Trace()
    ctx = StageContext(trace=trace)
    pipeline = Pipeline([stage], on_output=out)
    was = llm.cfg.kv_reuse
    llm.cfg.kv_reuse = warm
    rows: list[dict[str, Any]] = []
    await pipeline.start(ctx)
    try:
        for i, text in enumerate(caller_turns(turns)):
            turn = trace.begin_turn(speech_end=time.monotonic_ns())
            ended.clear()
            pipeline.push(UserTurnEnded(text), Direction.DOWNSTREAM)
            await asyncio.wait_for(ended.wait(), 120)
            ev = turn.events
            stats = llm.last
            assert stats is not None
            rows.append({
                "turn": i + 1, "words": len(text.split()),
                "llm_first_token_ms": round((ev["llm_first_token"] - ev["llm_request"]) / 1e6, 1),
                "prompt": stats.prompt, "reused": stats.reused, "evaluated": stats.evaluated,
                "restored": stats.restored, "shifted": stats.shifted,
            })
            trace.abandon()
    finally:
        llm.cfg.kv_reuse = was
        await pipeline.stop()
        await ctx.cancel_all()
    ms = [r["llm_first_token_ms"] for r in rows]
    return {"warm": warm, "turns": len(rows), "llm_first_token": medians(ms), "rows": rows}


async def main_async(args: argparse.Namespace, cfg: Config) -> dict:
    t = time.monotonic()
    llm = LocalLLM(cfg.llm)
    llm.warmup()
    print(f"model loaded in {time.monotonic() - t:.1f} s", flush=True)
    runs = {}
    for name, warm in (("warm", True), ("old", False)):
        if args.mode in (name, "both"):
            llm.warmup()  # each call starts with only the system prompt cached
            t = time.monotonic()
            runs[name] = await run_long_call(cfg, llm, args.turns, warm)
            print(f"{name}: {args.turns} turns in {time.monotonic() - t:.1f} s", flush=True)
    llm.close()
    return {"benchmark": "long_call", "turns": args.turns, "context": cfg.llm.context,
            "history_turns": cfg.llm.history_turns, "max_tokens": cfg.llm.max_tokens,
            "threads": cfg.llm.threads, "batch_threads": cfg.llm.batch_threads, "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--mode", choices=["both", "warm", "old"], default="both")
    ap.add_argument("--json-out")
    add_config_flags(ap, sections=["llm", "agent"])
    args = ap.parse_args()
    cfg = config_from_args(args)
    res = asyncio.run(main_async(args, cfg))
    runs = res["runs"]
    names = list(runs)
    print(f"\n{'turn':>4}{'words':>6}" + "".join(
        f"{name + ' ttft ms':>16}{'prompt':>8}{'eval':>6}{'shift':>6}" for name in names))
    for i in range(res["turns"]):
        line = f"{i + 1:>4}{runs[names[0]]['rows'][i]['words']:>6}"
        for name in names:
            r = runs[name]["rows"][i]
            line += f"{r['llm_first_token_ms']:>16.1f}{r['prompt']:>8}{r['evaluated']:>6}{r['shifted']:>6}"
        print(line)
    for name in names:
        m = runs[name]["llm_first_token"]
        print(f"{name}: llm_first_token p50 first 10 {m['first10_p50_ms']} ms, last 10 "
              f"{m['last10_p50_ms']} ms, ratio {m['ratio']}")
    line = {"benchmark": "long_call", "turns": res["turns"],
            **{f"llm_first_token_{name}": runs[name]["llm_first_token"] for name in names}}
    if "warm" in runs:
        line["bar_last10_within_1_5x"] = runs["warm"]["llm_first_token"]["ratio"] <= BAR
    emit(res, args.json_out, line=line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
