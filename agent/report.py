"""``voxline trace report``: percentiles per span, budget violations, and a per-turn waterfall."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import VoxlineError, require
from agent.trace import SPAN_ORDER


def load_records(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        raise VoxlineError(f"trace file not found: {p}")
    out: list[dict[str, Any]] = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise VoxlineError(f"{p}:{i}: not a JSON line ({exc.msg})") from None
        if not isinstance(rec, dict) or "type" not in rec:
            raise VoxlineError(f"{p}:{i}: not a voxline trace record")
        out.append(rec)
    return out


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95/p99 per span over complete turns, and the budget violations."""
    samples: dict[str, list[float]] = {}
    budgets: dict[str, float | None] = {}
    over: dict[str, int] = {}
    turns = incomplete = 0
    for rec in records:
        if rec["type"] == "session":
            lags = rec.get("partial_lag_ms", [])
            samples.setdefault("partial_lag", []).extend(lags)
            if rec.get("violations", {}).get("partial_lag"):
                over["partial_lag"] = over.get("partial_lag", 0) + rec["violations"]["partial_lag"]
            continue
        if rec["type"] not in ("turn", "greeting"):
            continue
        if not rec.get("complete", False):
            incomplete += 1
            continue
        turns += rec["type"] == "turn"
        for name, span in rec.get("spans", {}).items():
            samples.setdefault(name, []).append(float(span["ms"]))
            budgets[name] = span.get("budget_ms")
            if span.get("over"):
                over[name] = over.get(name, 0) + 1
    spans = {}
    for name in sorted(samples, key=lambda n: SPAN_ORDER.index(n) if n in SPAN_ORDER else 99):
        xs = np.asarray(samples[name], dtype=np.float64)
        if xs.size == 0:
            continue
        spans[name] = {
            "n": int(xs.size),
            "p50": float(np.percentile(xs, 50)),
            "p95": float(np.percentile(xs, 95)),
            "p99": float(np.percentile(xs, 99)),
            "max": float(xs.max()),
            "budget": budgets.get(name),
            "over": over.get(name, 0),
        }
    return {"turns": turns, "incomplete": incomplete, "spans": spans}


def format_table(summary: dict[str, Any]) -> str:
    head = f"{'span':<18}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'max ms':>10}{'budget':>9}{'over':>7}"
    lines = [head, "-" * len(head)]
    for name, s in summary["spans"].items():
        budget = f"{s['budget']:.0f}" if s["budget"] is not None else "-"
        flag = "  !" if s["over"] else ""
        lines.append(
            f"{name:<18}{s['n']:>6}{s['p50']:>10.1f}{s['p95']:>10.1f}{s['p99']:>10.1f}"
            f"{s['max']:>10.1f}{budget:>9}{s['over']:>7}{flag}"
        )
    lines.append(
        f"{summary['turns']} complete turns, {summary['incomplete']} interrupted or unanswered; "
        "times are wall-clock ms, monotonic clock, measured in the voxline process"
    )
    return "\n".join(lines)


def draw_waterfall(records: list[dict[str, Any]], png: str | Path, max_turns: int = 40) -> int:
    """One row per turn: each span as a bar from its start to its end (ms from the end of the
    caller's speech), a tick where its budget runs out, red when over budget."""
    mpl = require("matplotlib", what="drawing the waterfall (--png)", extra="report")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    turns = [r for r in records if r["type"] in ("turn", "greeting") and r.get("spans")][:max_turns]
    if not turns:
        raise VoxlineError("the trace has no turns with spans to draw")
    order = [n for n in SPAN_ORDER if n != "partial_lag"]
    colors = dict(zip(order, plt.get_cmap("tab10").colors, strict=False))
    rows = [(t, name, s) for t in turns for name, s in t["spans"].items()]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.5))
    labels = []
    for y, (t, name, s) in enumerate(rows):
        color = "#d62728" if s["over"] else colors.get(name, "#7f7f7f")
        ax.barh(y, max(s["ms"], 0.5), left=s["start_ms"], color=color, height=0.7)
        if s.get("budget_ms") is not None:
            x = s["start_ms"] + s["budget_ms"]
            ax.plot([x, x], [y - 0.4, y + 0.4], color="black", linewidth=1.2)
        ax.text(s["start_ms"] + max(s["ms"], 0.5) + 5, y, f"{s['ms']:.0f} ms", va="center", fontsize=7)
        labels.append(f"{t['type']} {t['turn']} · {name}")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the end of the caller's speech (greeting: from call start); | = budget")
    ax.set_title("voxline per-turn latency waterfall")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return len(turns)
