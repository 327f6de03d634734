"""The VAD's end of speech in recorded noise: every clip of ../shared/data/speech clean and mixed
with noise at 20 and 10 dB SNR, run through the VAD alone, with its noise rule on and off.

Per condition, the distribution of (SpeechStopped decision - the voice's true end) over the clips:
the decision is the end of the audio frame after which the SpeechStopped of the utterance under
way at the true end came; the true end is where the clean clip's voice stopped, by the VAD on the
clean clip (noise rule off: where its last SpeechStopped says the voice stopped, the end the
voice-to-voice clock starts from) or, where later, by energy alone (the clean clip's last 20-ms
frame within 35 dB of its loudest, above -60 dBFS and 15 dB above its own floor: speech that
Silero misses in the clean clip may be heard in the noisy one). On a clean clip the delay is
``stop_ms`` and up to a window; the bar is a p95 in noise within 150 ms of the clean one. Also,
per clean clip, the SpeechStopped and SpeechPaused counts with the rule on and off (the rule must
not stop clean speech mid-utterance), and the stops in noise. Prints a table and one JSON line;
``--json-out`` writes it too.

For other benchmarks: :func:`load_noise` and :func:`mix_at_snr` (``tests/data/noise``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.audio import read_audio, read_wav  # noqa: E402
from agent.config import VADConfig  # noqa: E402
from agent.frames import FRAME_SAMPLES, AudioIn, Direction, SpeechPaused, SpeechStopped  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from stages.vad import LOUD_DB, LOUD_FLOOR, SileroModel, VADStage  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "speech"
NOISE = ROOT / "tests" / "data" / "noise"
KINDS = ("babble", "machine")  # tests/data/noise/<kind>.wav; LICENSES.md beside them
SR = 16_000
TAIL_S = 4.0  # the noise goes on this long after each clip: a later stop counts as never


def load_noise(kind: str = "babble") -> np.ndarray:
    """A recorded noise as 16 kHz mono int16 that loops without a seam: ``babble`` (six people
    talking; Silero keeps hearing speech in it after a voice stops) or ``machine`` (a recorded
    helicopter's steady hum, which Silero tells from speech)."""
    pcm, rate = read_wav(NOISE / f"{kind}.wav")
    if rate != SR or pcm.shape[1] != 1:
        raise ValueError(f"{kind}.wav: expected 16 kHz mono, got {rate} Hz x {pcm.shape[1]}")
    return pcm[:, 0]


def active_power(speech: np.ndarray) -> float:
    """Mean square (int16 units) of the speech's active part: its 20-ms frames within 35 dB of
    the loudest one and above -60 dBFS, the VAD's own rule for where a voice is."""
    x = np.asarray(speech, dtype=np.float64)
    n = len(x) // FRAME_SAMPLES * FRAME_SAMPLES
    if n == 0:
        return float(np.mean(x * x)) if len(x) else 0.0
    ms = np.mean(x[:n].reshape(-1, FRAME_SAMPLES) ** 2, axis=1)
    floor = max(ms.max() * 10 ** (-LOUD_DB / 10), (LOUD_FLOOR * 32768) ** 2)
    active = ms[ms >= floor]
    return float(active.mean()) if len(active) else 0.0


def energy_end(speech: np.ndarray) -> int:
    """End sample of the last 20-ms frame within 35 dB of the loudest, above -60 dBFS and 15 dB
    above the recording's own floor (its 5th-percentile frame): where the voice stops by energy."""
    x = np.asarray(speech, dtype=np.float64)
    n = len(x) // FRAME_SAMPLES * FRAME_SAMPLES
    if n == 0:
        return 0
    ms = np.mean(x[:n].reshape(-1, FRAME_SAMPLES) ** 2, axis=1)
    floor = max(ms.max() * 10 ** (-LOUD_DB / 10), (LOUD_FLOOR * 32768) ** 2,
                np.percentile(ms, 5) * 10 ** 1.5)
    loud = np.flatnonzero(ms >= floor)
    return int(loud[-1] + 1) * FRAME_SAMPLES if len(loud) else 0


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    """``speech`` plus ``noise`` (looped from a ``seed``-chosen point) at ``snr_db`` below the
    speech's active level; int16 in and out, as long as ``speech``. A mix that would clip is
    scaled down whole, so the SNR holds. Silent speech comes back unchanged."""
    s = np.asarray(speech, dtype=np.int16)
    p_speech = active_power(s)
    if p_speech == 0.0 or len(noise) == 0:
        return s.copy()
    start = int(np.random.default_rng(seed).integers(len(noise)))
    n = np.asarray(noise, dtype=np.float64)[(start + np.arange(len(s))) % len(noise)]
    p_noise = float(np.mean(n * n))
    if p_noise == 0.0:
        return s.copy()
    y = s.astype(np.float64) + n * np.sqrt(p_speech / (p_noise * 10 ** (snr_db / 10)))
    peak = float(np.abs(y).max())
    if peak > 32767.0:
        y *= 32767.0 / peak
    return np.rint(y).astype(np.int16)


@dataclasses.dataclass(slots=True)
class Run:
    stops: list[tuple[int, int, int]]  # (decided at sample, started_at, voice end sample)
    pauses: int
    starts: list[int]  # where each utterance started
    open_since: int | None  # where the utterance still open at the end began


def run_vad(model: SileroModel, pcm: np.ndarray, cfg: VADConfig) -> Run:
    """The VAD over ``pcm`` in 20-ms frames; each stop with the sample after which it came."""
    stage = VADStage(cfg, model=model)
    out: list = []
    pipe = Pipeline([stage], on_output=out.append)
    stops, pauses = [], 0
    for k, i in enumerate(range(0, len(pcm), FRAME_SAMPLES)):
        frame = AudioIn(pcm[i : i + FRAME_SAMPLES], offset=i, t_ns=k + 1)
        pipe.push(frame, Direction.DOWNSTREAM)
        for f in out:
            if isinstance(f, SpeechStopped):
                # t_ns is the frame's index + 1: the frame where the voice stopped ends there
                stops.append((frame.end, f.started_at, f.speech_end_ns * FRAME_SAMPLES))
            elif isinstance(f, SpeechPaused):
                pauses += 1
        out.clear()
    starts = [s for _, s, _ in stops] + ([stage._started_at] if stage.in_speech else [])
    return Run(stops, pauses, starts, stage._started_at if stage.in_speech else None)


def delay_ms(run: Run, true_end: int) -> float:
    """When the utterance under way at the voice's true end stopped, in ms after that end (inf:
    not within the tail; nan: the VAD heard no speech before it)."""
    if run.open_since is not None and run.open_since <= true_end:
        return float("inf")
    decided = [d for d, started, _ in run.stops if started <= true_end]
    return (decided[-1] - true_end) * 1000 / SR if decided else float("nan")


def summary(delays: list[float]) -> dict:
    a = np.asarray(delays)
    heard = a[~np.isnan(a)]
    finite = heard[np.isfinite(heard)]
    out = {"n": len(heard), "never": int(len(heard) - len(finite)),
           "missed": int(len(a) - len(heard))}
    if len(finite):
        # a clip whose stop never came counts as the latest one in the percentiles
        worst = np.where(np.isfinite(heard), heard, max(finite.max(), TAIL_S * 1000))
        out.update(p50=round(float(np.percentile(worst, 50)), 1),
                   p95=round(float(np.percentile(worst, 95)), 1),
                   max=round(float(finite.max()), 1))
    return out


def main() -> int:
    from emit import emit  # beside this file: on the path when it runs as a script

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--noise", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--snr", nargs="+", type=float, default=[20.0, 10.0])
    ap.add_argument("--rule", choices=("both", "on", "off"), default="both",
                    help="the VAD's noise rule (VADConfig.noise_margin_db): off is before it")
    ap.add_argument("--only", help="clip id prefix, e.g. ls-")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    manifest = [json.loads(line) for line in (DATA / "manifest.jsonl").read_text().splitlines()]
    if args.only:
        manifest = [m for m in manifest if m["id"].startswith(args.only)]
    on = VADConfig()
    rules = {"off": dataclasses.replace(on, noise_margin_db=0.0), "on": on}
    if args.rule != "both":
        rules = {args.rule: rules[args.rule]}
    noises = {kind: load_noise(kind) for kind in args.noise}
    model = SileroModel(on)
    tail = np.zeros(int(TAIL_S * SR), np.int16)

    delays: dict[str, dict[str, list[float]]] = {}
    counts = {rule: {"stops": 0, "pauses": 0} for rule in rules}
    noisy_stops: dict[str, dict[str, int]] = {}
    late_starts: dict[str, dict[str, int]] = {}  # utterances the noise started after the voice
    changed_stops: list[str] = []
    skipped = []
    for i, m in enumerate(manifest, 1):
        speech = read_audio(DATA / m["path"])
        clean = np.concatenate([speech, tail])
        reference = run_vad(model, clean, dataclasses.replace(on, noise_margin_db=0.0))
        if not reference.stops:
            skipped.append(m["id"])  # the VAD hears no speech in it even when clean
            continue
        true_end = max(reference.stops[-1][2], energy_end(speech))
        per_rule_stops = {}
        for rule, cfg in rules.items():
            r = reference if rule == "off" else run_vad(model, clean, cfg)
            delays.setdefault("clean", {}).setdefault(rule, []).append(delay_ms(r, true_end))
            counts[rule]["stops"] += len(r.stops)
            counts[rule]["pauses"] += r.pauses
            per_rule_stops[rule] = len(r.stops)
        if len(set(per_rule_stops.values())) > 1:
            changed_stops.append(f"{m['id']} {per_rule_stops}")
        for kind, noise in noises.items():
            for snr in args.snr:
                noisy = mix_at_snr(clean, noise, snr, seed=i)
                label = f"{kind} {snr:g} dB"
                for rule, cfg in rules.items():
                    r = run_vad(model, noisy, cfg)
                    delays.setdefault(label, {}).setdefault(rule, []).append(delay_ms(r, true_end))
                    by_rule = noisy_stops.setdefault(label, {})
                    by_rule[rule] = by_rule.get(rule, 0) + len(r.stops)
                    after = late_starts.setdefault(label, {})
                    after[rule] = after.get(rule, 0) + sum(s > true_end for s in r.starts)

    table = {label: {rule: summary(d) for rule, d in by_rule.items()}
             for label, by_rule in delays.items()}
    print(f"end of speech after the voice's true end, ms ({len(manifest) - len(skipped)} clips; "
          f"stop_ms {on.stop_ms}; never: no stop within {TAIL_S:g} s; missed: no speech heard)")
    print(f"{'condition':16s} {'rule':4s} {'p50':>6s} {'p95':>6s} {'max':>6s} {'never':>5s} "
          f"{'missed':>6s} {'p95 - clean':>11s}")
    for label, by_rule in table.items():
        for rule, s in by_rule.items():
            base = table["clean"][rule].get("p95")
            gap = f"{s['p95'] - base:+.0f}" if "p95" in s and base is not None else "-"
            print(f"{label:16s} {rule:4s} {s.get('p50', float('nan')):6.0f} "
                  f"{s.get('p95', float('nan')):6.0f} {s.get('max', float('nan')):6.0f} "
                  f"{s['never']:5d} {s['missed']:6d} {gap:>11s}")
    for rule, c in counts.items():
        print(f"clean, rule {rule}: {c['stops']} SpeechStopped, {c['pauses']} SpeechPaused")
    for label, by_rule in noisy_stops.items():
        print(f"{label}: SpeechStopped " + ", ".join(f"rule {r} {n}" for r, n in by_rule.items())
              + "; started in the noise after the voice: "
              + ", ".join(f"rule {r} {n}" for r, n in late_starts[label].items()))
    for line in changed_stops:
        print(f"  stops per clip changed: {line}")
    if skipped:
        print(f"skipped (no speech heard in the clean clip): {', '.join(skipped)}")
    result = {"benchmark": "vad_noise", "stop_ms": on.stop_ms,
              "noise_margin_db": on.noise_margin_db, "noise_voice_db": on.noise_voice_db,
              "end_of_speech_ms": table, "clean_counts": counts, "noisy_stops": noisy_stops,
              "noise_starts_after_voice": late_starts,
              "stops_changed": changed_stops, "skipped": skipped}
    emit(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
