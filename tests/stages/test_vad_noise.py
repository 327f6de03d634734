"""Tests for the noise rule of stages/vad.py: speech on a line with recorded noise ends about when
it does on a quiet line, and speech on a quiet line ends as it did before the rule.

The noise is real (tests/data/noise/LICENSES.md): six people talking at once, the noise Silero
keeps hearing speech in after a voice stops, and a helicopter's steady hum, which it does not.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from speech import STEP_IDS, STEPS, perturb

from agent.audio import read_audio
from agent.config import VADConfig
from agent.frames import AudioIn, Direction, SpeechStarted, SpeechStopped
from agent.pipeline import Pipeline
from stages.vad import STOP_LEAD_WINDOWS, WINDOW, SileroModel, VADStage

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SR = 16_000
FRAME = 320
ON = VADConfig()
OFF = dataclasses.replace(ON, noise_margin_db=0.0)  # the VAD before the noise rule
CLIPS = (  # LibriSpeech, CC-BY-4.0 (tests/data/LICENSES.md, tests/data/noise/LICENSES.md)
    "ls-dev-clean-1988-24833-0000.wav",
    "noise/ls-dev-clean-1988-24833-0001.wav",
    "noise/ls-dev-clean-1988-24833-0002.wav",
    "noise/ls-dev-clean-1988-24833-0003.wav",
    "ls-dev-clean-1272-128104-0000.wav",
    "ls-dev-clean-2412-153948-0002.wav",
    "ls-test-clean-4507-16021-0012.wav",
    "ls-test-clean-61-70968-0000.wav",
)
SNRS = (20.0, 10.0)
SEEDS = range(8)  # where in the noise each mix starts: 8 x 8 clips x 2 SNRs = 128 mixes
TAIL = np.zeros(2 * SR, np.int16)  # the line goes on after the voice; a stop later than that: inf
# The bar: a stop in noise at most LATE_MS after the same clip's stop on a quiet line, at p95,
# and not more than a few mixes past SLOW_MS. Measured (all four input steps alike): with the
# rule p95 160 ms, 2 mixes past 400 ms; without it p95 about 500 ms, 10 mixes past 400 ms.
LATE_MS = 250.0
SLOW_MS = 400.0
SLOW_MIXES = 4


def bench_noise():
    """benchmarks/noise.py, whose mix_at_snr and load_noise the benchmarks use too."""
    spec = importlib.util.spec_from_file_location("bench_noise", ROOT / "benchmarks" / "noise.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


NOISE = bench_noise()


@pytest.fixture(scope="module")
def model() -> SileroModel:
    return SileroModel(ON)


@dataclasses.dataclass(slots=True)
class Heard:
    stops: list[tuple[int, int, int]]  # (decided after sample, started_at, voice end) per stop
    starts: int
    open_since: int | None  # the utterance still open at the end began there
    floor_dbfs: float  # the noise floor the VAD tracked, at the end


def hear(model: SileroModel, pcm: np.ndarray, cfg: VADConfig) -> Heard:
    """The VAD over ``pcm`` in 20-ms frames; for each stop, the end of the frame it came after."""
    stage = VADStage(cfg, model=model)
    out: list = []
    pipe = Pipeline([stage], on_output=out.append)
    stops, starts = [], 0
    for k, i in enumerate(range(0, len(pcm), FRAME)):
        frame = AudioIn(pcm[i : i + FRAME], offset=i, t_ns=k + 1)
        pipe.push(frame, Direction.DOWNSTREAM)
        for f in out:
            if isinstance(f, SpeechStopped):
                stops.append((frame.end, f.started_at, f.speech_end_ns * FRAME))
            starts += isinstance(f, SpeechStarted)
        out.clear()
    return Heard(stops, starts, stage._started_at if stage.in_speech else None,
                 stage.noise_floor_dbfs)


def decided(heard: Heard, voice_end: int) -> float:
    """Where the stop of the utterance under way at ``voice_end`` was decided (inf: never)."""
    if heard.open_since is not None and heard.open_since <= voice_end:
        return math.inf
    ends = [d for d, started, _ in heard.stops if started <= voice_end]
    return float(ends[-1]) if ends else math.nan


@pytest.fixture(scope="module")
def clean_runs(model: SileroModel) -> dict[str, tuple[np.ndarray, int, float]]:
    """Each clip with the tail, where its voice ends on a quiet line, and where the VAD (rule
    on) decides the stop there."""
    runs = {}
    for name in CLIPS:
        pcm = np.concatenate([read_audio(DATA / name), TAIL])
        voice_end = hear(model, pcm, OFF).stops[-1][2]
        runs[name] = (pcm, voice_end, decided(hear(model, pcm, ON), voice_end))
    return runs


def lateness(model: SileroModel, clean_runs, cfg: VADConfig, how: str, kind: str = "babble"):
    """ms by which each noisy mix's stop comes after the clean clip's, over CLIPS x SNRS x SEEDS;
    every input sample moved as ``how`` says (speech.perturb) after mixing."""
    noise = NOISE.load_noise(kind)
    late = []
    for pcm, voice_end, clean_stop in clean_runs.values():
        for snr in SNRS:
            for seed in SEEDS:
                noisy = perturb(NOISE.mix_at_snr(pcm, noise, snr, seed=seed), how)
                late.append((decided(hear(model, noisy, cfg), voice_end) - clean_stop) * 1000 / SR)
    late = np.asarray(late)
    assert not np.isnan(late).any()  # the VAD heard every mix's speech
    return late


def on_time(late: np.ndarray) -> bool:
    return bool(np.percentile(late, 95) <= LATE_MS and np.sum(late > SLOW_MS) <= SLOW_MIXES)


# --- speech in noise ---


@pytest.mark.parametrize("how", STEPS, ids=STEP_IDS)
def test_speech_in_babble_ends_about_when_it_does_on_a_quiet_line(model, clean_runs, how) -> None:
    late = lateness(model, clean_runs, ON, how)
    print(f"rule on, {how or 'exact'}: p50 {np.median(late):.0f} ms, p95 "
          f"{np.percentile(late, 95):.0f} ms, {np.sum(late > SLOW_MS)} past {SLOW_MS:.0f} ms")
    assert on_time(late)
    # the margin: the p95 itself has room, whatever one step of input does to a window
    assert np.percentile(late, 95) <= LATE_MS - 50


@pytest.mark.parametrize("how", ["", "dither"], ids=["exact", "dither"])
def test_without_the_noise_rule_speech_in_babble_ends_late(model, clean_runs, how) -> None:
    """The same mixes through the VAD as it was: Silero goes on hearing speech in the babble,
    and the bar above fails by far (so it can fail)."""
    late = lateness(model, clean_runs, OFF, how)
    assert not on_time(late)
    assert np.percentile(late, 95) > LATE_MS + 100
    assert np.sum(late > SLOW_MS) >= 2 * SLOW_MIXES


def test_speech_in_a_steady_hum_ends_on_time(model, clean_runs) -> None:
    """The hum does not keep Silero hearing speech, but without the rule the voice's end ran on
    into it (every frame within 35 dB of the peak was the voice), so the stop came late."""
    late_on = lateness(model, clean_runs, ON, "", kind="machine")
    late_off = lateness(model, clean_runs, OFF, "", kind="machine")
    assert np.percentile(late_on, 95) <= 100 and late_on.max() <= 200
    assert np.median(late_off) >= np.median(late_on) + 60


def test_the_voice_to_voice_clock_starts_where_the_voice_stopped(model, clean_runs) -> None:
    """In babble at 10 dB, speech_end_ns (the frame where the voice stopped) is where the clean
    clip's voice stopped or earlier, where the noise covers the voice's last, softest frames
    (measured: median 140 ms early, 90% no later than 20 ms early); before, it ran on to Silero's
    end of speech (median 120 ms late, 10% more than 500 ms late)."""
    noise = NOISE.load_noise("babble")
    errors = {"on": [], "off": []}
    for pcm, voice_end, _ in clean_runs.values():
        for seed in SEEDS:
            noisy = NOISE.mix_at_snr(pcm, noise, 10.0, seed=seed)
            for rule, cfg in (("on", ON), ("off", OFF)):
                heard = hear(model, noisy, cfg)
                ends = [e for _, started, e in heard.stops if started <= voice_end]
                errors[rule].append((ends[-1] - voice_end) * 1000 / SR)
    on, off = np.asarray(errors["on"]), np.asarray(errors["off"])
    assert np.percentile(on, 90) <= 40 and np.median(on) >= -200
    assert np.percentile(off, 90) >= np.percentile(on, 90) + 100


# --- quiet lines and noise alone ---


@pytest.mark.parametrize("how", STEPS, ids=STEP_IDS)
def test_clean_speech_stops_as_before(model, how) -> None:
    """On a quiet line the rule adds no stop and moves no start. Where the recording has a floor
    of its own (two of these clips: -58 and -44 dBFS) the voice's end no longer runs on into it,
    so the stop may come up to STOP_LEAD_WINDOWS earlier; never later."""
    moved = 0
    for name in CLIPS:
        pcm = perturb(np.concatenate([read_audio(DATA / name), TAIL]), how)
        before, after = hear(model, pcm, OFF), hear(model, pcm, ON)
        assert len(after.stops) == len(before.stops), name
        for (d_on, s_on, _), (d_off, s_off, _) in zip(after.stops, before.stops, strict=True):
            assert s_on == s_off, name
            assert -(STOP_LEAD_WINDOWS * WINDOW + FRAME) <= d_on - d_off <= 0, name
            moved += d_on != d_off
    assert moved <= 2


def test_a_steady_hum_alone_is_not_speech(model) -> None:
    hum = NOISE.load_noise("machine").astype(np.float64)
    hum = np.tile(hum, -(-20 * SR // len(hum)))[: 20 * SR]
    for dbfs in (-40.0, -30.0, -20.0):
        pcm = np.rint(hum * 10 ** (dbfs / 20) * 32768 / np.sqrt(np.mean(hum**2))).astype(np.int16)
        heard = hear(model, pcm, ON)
        assert heard.starts == 0 and heard.open_since is None
        # the floor it tracks is the hum's level (its quietest stretches, a few dB under)
        assert dbfs - 6 <= heard.floor_dbfs <= dbfs


def test_babble_alone_is_left_to_silero(model) -> None:
    """Six people talking, and no caller: Silero hears speech in it now and then (in 36 s of it,
    nine utterances, the longest 7 s), and with no voice rising above the floor the noise rule
    has nothing to end them by. It starts none of its own and ends none later; none is endless."""
    babble = np.tile(NOISE.load_noise("babble").astype(np.float64), 3)
    pcm = np.rint(babble * 10 ** (-30 / 20) * 32768 / np.sqrt(np.mean(babble**2))).astype(np.int16)
    on, off = hear(model, pcm, ON), hear(model, pcm, OFF)
    assert on.starts == off.starts and len(on.stops) == len(off.stops)
    for (d_on, s_on, _), (d_off, s_off, _) in zip(on.stops, off.stops, strict=True):
        assert s_on == s_off and d_on <= d_off
    assert all(d - started < 8 * SR for d, started, _ in on.stops)
    assert on.open_since is None or on.open_since > len(pcm) - 8 * SR


def test_speech_does_not_start_again_in_the_noise_after_it_stopped(model, clean_runs) -> None:
    """After the stop, the babble Silero still hears does not start an utterance of its own
    (a caller barging in on the agent with nothing but the line's noise)."""
    noise = NOISE.load_noise("babble")
    extra = {"on": 0, "off": 0}
    for pcm, voice_end, _ in clean_runs.values():
        for seed in SEEDS:
            noisy = NOISE.mix_at_snr(pcm, noise, 10.0, seed=seed)
            for rule, cfg in (("on", ON), ("off", OFF)):
                heard = hear(model, noisy, cfg)
                starts = [started for _, started, _ in heard.stops] + [heard.open_since or 0]
                extra[rule] += sum(1 for started in starts if started > voice_end)
    assert extra["on"] <= extra["off"]


def test_the_noise_rule_can_be_turned_off(model) -> None:
    assert hear(model, read_audio(DATA / CLIPS[0]), OFF).floor_dbfs == -math.inf  # not tracked


# --- the mixing helper ---


def test_mix_at_snr_sets_the_snr_over_the_voice_and_never_clips() -> None:
    speech = np.concatenate([read_audio(DATA / CLIPS[0]), TAIL])
    noise = NOISE.load_noise("machine")
    active = NOISE.active_power(speech)
    for snr in (20.0, 10.0, 0.0):
        mix = NOISE.mix_at_snr(speech, noise, snr, seed=3)
        assert mix.dtype == np.int16 and len(mix) == len(speech)
        added = mix.astype(np.float64) - speech
        assert abs(10 * math.log10(active / np.mean(added**2)) - snr) < 0.1
        assert np.array_equal(mix, NOISE.mix_at_snr(speech, noise, snr, seed=3))
    # a loud voice: the mix would clip, so the whole of it is scaled down and the SNR holds
    loud = (speech.astype(np.int32) * 8).clip(-32768, 32767).astype(np.int16)
    mix = NOISE.mix_at_snr(loud, noise, 0.0).astype(np.float64)
    x = loud.astype(np.float64)
    scale = float(mix @ x / (x @ x))
    assert scale < 0.9 and np.abs(mix).max() == 32767
    snr = 10 * math.log10(NOISE.active_power(loud) * scale**2 / np.mean((mix - scale * x) ** 2))
    assert abs(snr) < 0.5
