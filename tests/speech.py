"""The speech clips the tests transcribe, their references, and the input perturbations that
prove a test's margin against numeric noise.

Whisper tiny.en is a small model: on some clips one sample off by one step flips a word (the
7-word "why should one halt on the way" came back as "wash it one halt on the way" that way), and
another CPU's kernels move it as much. So a test that judges a transcript uses only the clips
below, each checked to come out right — WER 0 here — in int8 and in float32, and with its
samples moved by +1, -1 and a seeded random ±1 step (``tests/stages/test_asr_margin.py`` keeps
checking it), and judges several clips together where it can.

``VOXLINE_TEST_PERTURB`` (``+1``, ``-1`` or ``dither``) makes :func:`load` hand out perturbed
samples, so any test module can be run again with every input one step off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.audio import int16_to_float, read_audio

DATA = Path(__file__).resolve().parent / "data"
PERTURB_ENV = "VOXLINE_TEST_PERTURB"
PERTURBATIONS = ("+1", "-1", "dither")
# every input as it is and one step off: what a test parametrizes over to prove its margin
STEPS = ("", *PERTURBATIONS)
STEP_IDS = ("exact", "plus1", "minus1", "dither")


@dataclass(frozen=True, slots=True)
class Clip:
    file: str
    text: str  # the corpus reference (LibriSpeech: upper case, no punctuation)

    @property
    def words(self) -> int:
        return len(self.text.split())


CLIPS: dict[str, Clip] = {  # licences: tests/data/LICENSES.md
    "kittens": Clip("ls-dev-clean-1988-24833-0000.wav",
                    "THE TWO STRAY KITTENS GRADUALLY MAKE THEMSELVES AT HOME"),
    "quilter": Clip("ls-dev-clean-1272-128104-0000.wav",
                    "MISTER QUILTER IS THE APOSTLE OF THE MIDDLE CLASSES AND WE ARE GLAD TO WELCOME "
                    "HIS GOSPEL"),
    "honest": Clip("ls-dev-clean-2412-153948-0002.wav",
                   "NO ONE WHO IS HIMSELF HONEST WILL DOUBT MY BEING SO"),
    "wizard": Clip("ls-test-clean-61-70968-0000.wav",
                   "HE BEGAN A CONFUSED COMPLAINT AGAINST THE WIZARD WHO HAD VANISHED BEHIND THE "
                   "CURTAIN ON THE LEFT"),
}


def perturb(pcm: np.ndarray, how: str) -> np.ndarray:
    """``pcm`` with every sample one step off: ``+1``, ``-1``, or ``dither`` (a seeded random
    -1, 0 or +1 per sample); ``""`` leaves it as it is."""
    if not how:
        return pcm
    x = pcm.astype(np.int32)
    if how == "+1":
        x += 1
    elif how == "-1":
        x -= 1
    elif how == "dither":
        x += np.random.default_rng(len(x)).integers(-1, 2, len(x))
    else:
        raise ValueError(f"{PERTURB_ENV}={how!r}: use one of {', '.join(PERTURBATIONS)}")
    return np.clip(x, -32768, 32767).astype(np.int16)


def samples(name: str, rate: int = 16_000) -> np.ndarray:
    """The clip's int16 samples as the file holds them."""
    return read_audio(DATA / CLIPS[name].file, rate)


def load(name: str, rate: int = 16_000) -> np.ndarray:
    """The clip's int16 samples, perturbed as ``$VOXLINE_TEST_PERTURB`` says (if it is set)."""
    return perturb(samples(name, rate), os.environ.get(PERTURB_ENV, ""))


def load_float(name: str) -> np.ndarray:
    return int16_to_float(load(name))


def text(name: str) -> str:
    return CLIPS[name].text


# The longer inputs tests build from the clips. A buffer of several sentences is where Whisper
# tiny.en (no timestamps) is most fragile — it may drop a whole sentence, depending on the order
# and on one step of input — so these exact sequences are the ones the margin test checks.
ONE_BUFFER = ("kittens", "honest", "quilter")  # 13 s in one model call (+1 s of silence)
LONG_FILE = ("kittens", "quilter", "honest") * 3  # 43 s with 0.5-s pauses, cut into chunks


def joined(names: tuple[str, ...], gap_s: float = 0.0, tail_s: float = 0.0,
           perturbed: bool = True) -> tuple[np.ndarray, str]:
    """The clips one after another with ``gap_s`` of silence after each (``tail_s`` after the
    last instead), and the joined reference."""
    gap, tail = np.zeros(int(gap_s * 16_000), np.int16), np.zeros(int(tail_s * 16_000), np.int16)
    get = load if perturbed else samples
    parts = [p for i, n in enumerate(names) for p in (get(n), gap if i < len(names) - 1 else tail)]
    return np.concatenate(parts), " ".join(text(n) for n in names)


def matroska(pcm: np.ndarray, target: object) -> None:
    """Write 16-kHz int16 mono ``pcm`` as PCM in Matroska to ``target`` (a path or a binary
    file object): a container libsndfile cannot read, so decoding goes through PyAV."""
    import av

    with av.open(target if not isinstance(target, Path) else str(target), "w",
                 format="matroska") as out:
        stream = out.add_stream("pcm_s16le", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
