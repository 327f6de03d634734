"""Writes cuts.json: for each turn-test clip, the sample at which the test cuts it mid-sentence.

Run once, by hand (``python tests/data/turn/make_cuts.py`` from the repo root); the tests read
the JSON and never run ASR. Word times come from faster-whisper word timestamps with the
embedded Whisper tiny.en. The cut follows a function word ("the", "and", "to", ... with no
punctuation after it, so the sentence is plainly unfinished) nearest the middle of the speech,
at least 1 s after the first word and 0.5 s before the last word ends; the cut sample is the
middle of the quietest 10-ms frame within 40 ms of that word boundary (tiny.en's word times are
coarse, and read speech often has no gap between words).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from agent.audio import int16_to_float, read_audio  # noqa: E402
from stages.asr.whisper import embedded_model_dir  # noqa: E402

DATA = ROOT / "tests" / "data"
CLIPS = (  # paths under tests/data; licences in tests/data/LICENSES.md and turn/LICENSES.md
    # (the kittens clip has no function word that far from both ends, so it is not here)
    "ls-dev-clean-1272-128104-0000.wav",
    "ls-dev-clean-2412-153948-0002.wav",
    "ls-test-clean-61-70968-0000.wav",
    "ls-test-clean-4507-16021-0012.wav",
    "asterisk-queue-youarenext.wav",
    "turn/ls-dev-clean-1988-24833-0001.wav",
    "turn/ls-dev-clean-2412-153948-0001.wav",
    "turn/ls-test-clean-1221-135766-0002.wav",
    "turn/librivox-sense-and-sensibility-01-0890.wav",
    "turn/librivox-sense-and-sensibility-01-0920.wav",
    "turn/librivox-sense-and-sensibility-01-0930.wav",
    "turn/mfa-falsetto2.wav",
    "turn/jfk-inaugural-ask-not.wav",
)
FUNCTION_WORDS = {
    "a", "an", "the", "of", "to", "and", "or", "but", "in", "on", "at", "with", "for", "from", "by",
    "as", "is", "was", "are", "were", "be", "been", "have", "has", "had", "will", "would", "can",
    "could", "should", "that", "which", "who", "whose", "his", "her", "their", "my", "your", "our",
    "its", "not",
}
RATE = 16_000
FRAME = 160  # 10 ms
SEARCH = 640  # 40 ms either side of the boundary
MIN_BEFORE_S, MIN_AFTER_S = 1.0, 0.5


def cut_for(pcm: np.ndarray, words: list) -> tuple[int, str, str]:
    first, last = words[0].start, words[-1].end
    middle = (first + last) / 2

    def ok(k: int) -> bool:
        w = words[k].word.strip()
        return (re.sub(r"[^a-z']", "", w.lower()) in FUNCTION_WORDS
                and not re.search(r"[,.;:?!]$", w)
                and words[k].end - first >= MIN_BEFORE_S and last - words[k].end >= MIN_AFTER_S)

    k = min((k for k in range(len(words) - 1) if ok(k)), key=lambda k: abs(words[k].end - middle))
    at = round(words[k].end * RATE)
    x = pcm.astype(np.float64)
    starts = range(max(0, at - SEARCH), min(len(pcm) - FRAME, at + SEARCH) + 1, FRAME // 2)
    quiet = min(starts, key=lambda i: float(np.dot(x[i:i + FRAME], x[i:i + FRAME])))
    said = " ".join(w.word.strip() for w in words[: k + 1])
    rest = " ".join(w.word.strip() for w in words[k + 1:])
    return quiet + FRAME // 2, said, rest


def main() -> None:
    from faster_whisper import WhisperModel

    model = WhisperModel(str(embedded_model_dir()), device="cpu", compute_type="int8")
    out = []
    for name in CLIPS:
        pcm = read_audio(DATA / name, RATE)
        segments, _ = model.transcribe(int16_to_float(pcm), language="en", beam_size=1,
                                       word_timestamps=True, condition_on_previous_text=False)
        words = [w for s in segments for w in (s.words or [])]
        cut, said, rest = cut_for(pcm, words)
        out.append({"file": name, "samples": len(pcm), "cut": cut, "said": said, "rest": rest})
        print(f"{name}: cut at {cut / RATE:.2f} s  {said} | {rest}")
    path = Path(__file__).with_name("cuts.json")
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
