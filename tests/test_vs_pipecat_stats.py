"""benchmarks/vs_pipecat.py's own arithmetic: rounds pooled into one level, the bootstrap
interval of the median ratio it publishes, and (z)'s reference words at each VAD stop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from vs_pipecat import nearest_rank, pool_rounds, ratio_interval, reference_words  # noqa: E402


def calls(v2v: dict[str, float | None], round_: int | None = None) -> list[dict]:
    return [{"line": 0, "clip": clip, "v2v_s": v, **({} if round_ is None else {"round": round_})}
            for clip, v in v2v.items()]


def raw(v2v: dict[str, float | None], cpu_s: float, rss_mb: float) -> dict:
    return {"calls": calls(v2v), "cpu_s": cpu_s, "wall_s": 10.0, "rss_mb": rss_mb,
            "build_s_p50": 0.5}


def test_rounds_pool_every_call_with_its_round_and_add_up_the_cost():
    pooled, server_s = pool_rounds([(raw({"x": 1.0, "y": 2.0}, 3.0, 100), 1.5),
                                    (raw({"x": 1.2, "y": None}, 4.0, 120), 2.5)])
    assert [(c["clip"], c["round"], c["v2v_s"]) for c in pooled["calls"]] == [
        ("x", 0, 1.0), ("y", 0, 2.0), ("x", 1, 1.2), ("y", 1, None)]
    assert pooled["cpu_s"] == 7.0 and pooled["wall_s"] == 20.0 and pooled["rss_mb"] == 120
    assert server_s == 4.0
    # a call without a reply is infinitely late in the pooled percentiles too
    assert nearest_rank([c["v2v_s"] for c in pooled["calls"]], 95) is None


def test_the_interval_is_tight_around_a_ratio_every_pair_shows():
    clips = {f"c{i}": 0.4 + 0.05 * i for i in range(10)}
    a = calls({k: 3 * v for k, v in clips.items()}, 0) + calls({k: 3 * v for k, v in clips.items()}, 1)
    c = calls(clips, 0) + calls(clips, 1)
    lo, hi = ratio_interval(a, c, set(clips), seed=1)
    assert lo == pytest.approx(3.0) and hi == pytest.approx(3.0)


def test_the_interval_widens_with_spread_counts_only_heard_clips_and_needs_pairs():
    import numpy as np

    rng = np.random.default_rng(0)
    clips = [f"c{i}" for i in range(12)]
    a = calls({k: float(rng.uniform(1.0, 2.5)) for k in clips})
    c = calls({k: 0.5 for k in clips})
    lo, hi = ratio_interval(a, c, set(clips), seed=1)
    point = float(np.median([x["v2v_s"] for x in a])) / 0.5
    assert lo < point < hi and hi - lo > 0.3
    # a clip outside the heard set is left out, however slow
    slow = a + calls({"deaf": 50.0})
    assert ratio_interval(slow, c + calls({"deaf": 0.5}), set(clips), seed=1) == [lo, hi]
    assert ratio_interval(a[:3], c[:3], set(clips), seed=1) is None  # too few pairs
    # (a) missing most replies: the interval has no upper end
    deaf = calls({k: (None if i < 8 else 1.0) for i, k in enumerate(clips)})
    lo, hi = ratio_interval(deaf, c, set(clips), seed=1)
    assert hi is None and (lo is None or lo >= 2.0)


def test_the_reference_stt_gives_each_stop_its_share_of_the_words_and_the_last_stop_the_rest():
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    # a stop a quarter into the voice: the first quarter of the words
    text, given = reference_words(words, 0, 1.0, 4.0)
    assert (text, given) == ("one two", 2)
    # the next stop just before the voice's end: everything not given yet
    text, given = reference_words(words, given, 3.95, 4.0)
    assert (text, given) == ("three four five six seven eight", 8)
    # a stop after everything was given (a breath after the voice) still gets a word
    assert reference_words(words, given, 4.5, 4.0) == ("eight", 8)
    # two stops close together: the second gets the next word, never nothing
    assert reference_words(words, 2, 1.1, 4.0) == ("three", 3)
