"""How the noise recordings here were made (LICENSES.md says from what); run it to make them again.

    cd "$(mktemp -d)" && apt-get download asterisk-core-sounds-{es,fr,it,ru}-wav openttd-opensfx
    for d in *.deb; do dpkg-deb -x "$d" root; done
    python tests/data/noise/make.py root

``babble.wav``: six people talking at once (four voices, in Spanish, French, Italian and
Russian), 12 s that loop without a seam. ``machine.wav``: the steady middle of a recorded
helicopter, 1.5 s that loop without a seam. Both 16 kHz mono int16 at -26 dBFS RMS.
"""

from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from agent.audio import (  # noqa: E402
    float_to_int16,
    int16_to_float,
    read_audio,
    resample,
    to_mono,
    write_wav,
)

RATE = 16_000
VOICES = ("es_MX_f_Allison", "fr_CA_f_June", "it_IT_m_Carlo", "ru_RU_f_IvrvoiceRU")
TALKERS = 6  # fewer and Silero hears a conversation; more and it hears a hiss
SECONDS = 12
LEVEL_DBFS = -26.0


def seamless(x: np.ndarray, length: int, fade: int) -> np.ndarray:
    """``length`` samples of ``x`` whose end runs into their start: the ``fade`` samples after
    ``length`` are blended into the first ones, so the result loops without a click."""
    y = x[:length].copy()
    ramp = np.linspace(0.0, 1.0, fade)
    y[:fade] = y[:fade] * ramp + x[length : length + fade] * (1 - ramp)
    return y


def at_level(x: np.ndarray) -> np.ndarray:
    return float_to_int16(x * 10 ** (LEVEL_DBFS / 20) / np.sqrt(np.mean(x**2)))


def talker(prompts: list[Path], first: int, length: int) -> np.ndarray:
    """One voice reading prompts back to back, each trimmed of its silences, at unit RMS."""
    parts: list[np.ndarray] = []
    total, i = 0, first
    while total < length + RATE:
        x = int16_to_float(read_audio(prompts[i % len(prompts)], RATE)).astype(np.float64)
        i += 1
        loud = np.flatnonzero(np.convolve(x * x, np.ones(160) / 160, "same") > 1e-5)
        if len(loud) < RATE:
            continue
        x = x[loud[0] : loud[-1]]
        parts.append(x / np.sqrt(np.mean(x * x)))
        total += len(x)
    return seamless(np.concatenate(parts), length, RATE // 2)


def babble(root: Path) -> np.ndarray:
    rng = np.random.default_rng(7)
    length = SECONDS * RATE
    prompts = []
    for voice in VOICES:
        files = sorted((root / "usr/share/asterisk/sounds" / voice).glob("*.wav"))
        rng.shuffle(files)  # type: ignore[arg-type]
        prompts.append(files)
    mix = np.zeros(length)
    for k in range(TALKERS):
        one = talker(prompts[k % len(VOICES)], 40 * (k // len(VOICES)), length)
        mix += np.roll(one, int(rng.integers(length)))
    return at_level(mix)


def opensfx(root: Path, title: str) -> tuple[np.ndarray, int]:
    """One sound of OpenSFX's ``opensfx.cat`` (entries: a name, then a WAV file) by its title."""
    import soundfile

    cat = (root / "usr/share/games/openttd/baseset/opensfx/opensfx.cat").read_bytes()
    for k in range(struct.unpack_from("<I", cat, 0)[0] // 8):
        offset, size = struct.unpack_from("<II", cat, 8 * k)
        offset &= 0x7FFFFFFF
        name_len = cat[offset]
        name = cat[offset + 1 : offset + 1 + name_len].decode("utf-8", "replace")
        if name.startswith(f'"{title}"'):
            data, rate = soundfile.read(io.BytesIO(cat[offset + 1 + name_len : offset + size]),
                                        dtype="int16", always_2d=True)
            return to_mono(data), rate
    raise SystemExit(f"{title!r} is not in opensfx.cat")


def machine(root: Path) -> np.ndarray:
    pcm, rate = opensfx(root, "Helicopter")
    x = int16_to_float(resample(pcm, rate, RATE)).astype(np.float64)
    middle = x[len(x) // 5 : len(x) - len(x) // 5]  # without the sound's fade in and out
    return at_level(seamless(middle, len(middle) - RATE // 10, RATE // 10))


def main(root: Path) -> None:
    write_wav(HERE / "babble.wav", babble(root))
    write_wav(HERE / "machine.wav", machine(root))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
