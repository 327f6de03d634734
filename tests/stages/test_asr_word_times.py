"""Word times: the token → word grouping and the voiced-step trimming of stages/asr/words.py on
made-up inputs, then WhisperBackend(word_times=True) with the embedded tiny.en model on real
speech, where the truth comes from how each buffer is built: N seconds of digital silence
before a clip, or a 1.5-s pause between two clips."""

import numpy as np
import pytest
import speech

from agent.audio import int16_to_float
from agent.config import ASRConfig
from stages.asr import words
from stages.asr.wer import normalize

RATE = 16_000
# Where each clip's speech begins inside its own file: the first 20-ms step whose energy rises
# out of the lead-in hiss (kittens -64 → -35 dBFS, quilter -64 → -49, honest -55 → -40, wizard
# -43 → -28), read once off the recordings.
ONSET_S = {"kittens": 0.48, "quilter": 0.54, "honest": 0.54, "wizard": 0.30}
TOLERANCE_S = 0.15  # a word edge may sit this far off the speech onset the buffer was built with
PAIRS = (("kittens", "honest"), ("honest", "quilter"), ("wizard", "kittens"), ("quilter", "wizard"))
PAUSE_S = 1.5


# --- grouping tokens into words -------------------------------------------------------------
def test_the_byte_level_table_covers_every_byte_once():
    assert sorted(words.BYTE_OF_CHAR.values()) == list(range(256))
    assert words.BYTE_OF_CHAR["Ġ"] == ord(" ") and words.BYTE_OF_CHAR["a"] == ord("a")


def test_words_are_the_split_text_with_their_tokens():
    text, got = words.split_words([b" Hello", b",", b" w", b"orld", b".", b"  ", b" ok"])
    assert text == " Hello, world.   ok"
    assert [w.text for w in got] == text.split()
    assert [(w.first, w.last, w.spoken) for w in got] == [(0, 2, 1), (2, 5, 4), (6, 7, 7)]


def test_a_character_split_across_tokens_belongs_to_both():
    # " 東" is b" \xe6\x9d\xb1": the first token carries the space and the first byte
    text, got = words.split_words([b" caf\xc3", b"\xa9", b" \xe6", b"\x9d\xb1", b"!"])
    assert text == " café 東!"
    assert [(w.text, w.first, w.last, w.spoken) for w in got] == [
        ("café", 0, 2, 2), ("東!", 2, 5, 4)]


def test_punctuation_alone_and_broken_bytes_still_make_words():
    text, got = words.split_words([b" -", b" \xe6"])  # a dash, then a truncated character
    assert text == " - \ufffd"
    assert [(w.text, w.first, w.last, w.spoken) for w in got] == [("-", 0, 1, 1), ("\ufffd", 1, 2, 2)]
    assert words.split_words([]) == ("", [])


def test_token_bytes_decode_as_the_tokenizer_does():
    tokenizers = pytest.importorskip("tokenizers")
    from stages.asr.whisper import embedded_model_dir

    try:
        path = embedded_model_dir() / "tokenizer.json"
    except Exception as exc:  # the embedded model is not installed
        pytest.skip(str(exc))
    tok = tokenizers.Tokenizer.from_file(str(path))
    pieces = words.TokenBytes(tok)
    eot = tok.token_to_id("<|endoftext|>")
    assert all(pieces(i).decode("utf-8", "replace") == tok.decode([i]) for i in range(eot))
    ids = tok.encode(" Naïve café — 東京, ok 😀! 3.5 %", add_special_tokens=False).ids
    text, got = words.split_words([pieces(i) for i in ids])
    assert text == tok.decode(ids)
    assert [w.text for w in got] == text.split()


# --- the alignment path and the voiced steps ------------------------------------------------
def test_jump_steps_are_the_first_visit_of_each_token():
    path = [(0, 0), (0, 1), (1, 2), (2, 2), (2, 3), (3, 4), (3, 5)]
    assert words.jump_steps(path, 3).tolist() == [0, 2, 2, 4]
    assert words.jump_steps([], 2).tolist() == [0, 0, 0]


def _tone(seconds: float, dbfs: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sqrt(2) * 10 ** (dbfs / 20) * np.sin(2 * np.pi * 200 * t)).astype(np.float32)


def _hiss(seconds: float, dbfs: float, seed: int = 0) -> np.ndarray:
    n = int(seconds * RATE)
    return (np.random.default_rng(seed).standard_normal(n) * 10 ** (dbfs / 20)).astype(np.float32)


def test_voiced_steps_are_the_speech_not_the_hiss_nor_a_click():
    hiss = _hiss(4.0, -60)
    audio = np.concatenate([np.zeros(RATE, np.float32), hiss.copy()])
    audio[RATE + 8000 : RATE + 8320] += _tone(0.02, -20)  # a 20-ms click in the hiss
    speech_at = [(2.0, 2.5), (2.6, 3.1)]  # two bursts, 100 ms apart: one stretch of speech
    for a, b in speech_at:
        audio[int(a * RATE) : int(b * RATE)] += _tone(b - a, -25)
    voiced = words.voiced_steps(audio)
    assert len(voiced) == len(audio) // 320
    assert np.flatnonzero(voiced).tolist() == list(range(100, 155))  # 2.0-3.1 s, gap filled


def test_voiced_steps_on_silence_and_on_almost_nothing():
    assert not words.voiced_steps(np.zeros(RATE, np.float32)).any()
    assert not words.voiced_steps(np.full(RATE, 1 / 32768, np.float32)).any()  # a dithered zero
    assert len(words.voiced_steps(np.zeros(100, np.float32))) == 0


def test_a_noisy_recording_keeps_its_quiet_speech():
    # a floor of -43 dBFS under speech at -25 and then -35 dBFS: 12 dB over the floor would
    # drop the quieter half, 15 dB under the peak keeps it
    audio = _hiss(3.0, -43)
    audio[RATE : 3 * RATE // 2] += _tone(0.5, -25)
    audio[3 * RATE // 2 : 2 * RATE] += _tone(0.5, -35)
    assert np.flatnonzero(words.voiced_steps(audio)).tolist() == list(range(50, 100))


def test_word_edges_are_trimmed_to_voiced_steps_and_never_go_back():
    _, tw = words.split_words([b" one", b" two", b".", b" three", b" -"])
    jumps = np.array([0, 30, 40, 42, 60, 60])
    voiced = np.zeros(70, bool)
    voiced[10:25] = voiced[32:38] = True  # nothing voiced under "three" and "-"
    got = words.timed_words(tw, jumps, voiced)
    assert [(w.text, w.start, w.end) for w in got] == [
        ("one", 0.2, 0.5), ("two.", 0.64, 0.76), ("three", 0.84, 1.2), ("-", 1.2, 1.2)]
    # an alignment that steps back (it cannot, but a word's tokens could overlap) is held
    backwards = words.timed_words(tw, np.array([0, 30, 20, 20, 60, 60]), np.ones(70, bool))
    assert all(a.end <= b.start for a, b in zip(backwards, backwards[1:], strict=False))


# --- the Whisper backend on real speech -----------------------------------------------------
@pytest.fixture(scope="module")
def backends():
    pytest.importorskip("ctranslate2")
    pytest.importorskip("faster_whisper")
    from stages.asr.whisper import WhisperBackend

    timed = WhisperBackend(ASRConfig(), word_times=True)
    plain = WhisperBackend(ASRConfig())
    timed.warmup()
    plain.warmup()
    return timed, plain


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.int16)


def _check_words(hyp, seconds: float) -> None:
    """Words are the text's words, in order, with times that never go back, inside the buffer."""
    assert " ".join(w.text for w in hyp.words) == " ".join(hyp.text.split())
    times = [t for w in hyp.words for t in (w.start, w.end)]
    assert times == sorted(times)
    assert all(0.0 <= t <= seconds for t in times), (times, seconds)


def test_the_flag_says_what_the_hypotheses_carry(backends):
    timed, plain = backends
    assert timed.capabilities.word_times and not plain.capabilities.word_times
    audio = [speech.load_float(n) for n in ONSET_S]
    with_words = timed.transcribe_batch(audio)
    without = plain.transcribe_batch(audio)
    assert [h.text for h in with_words] == [h.text for h in without]  # same decoding
    assert all(h.words for h in with_words) and not any(h.words for h in without)
    for hyp, buf in zip(with_words, audio, strict=True):
        _check_words(hyp, len(buf) / RATE)


@pytest.mark.parametrize("how", speech.STEPS, ids=speech.STEP_IDS)
def test_the_first_word_starts_where_speech_starts_after_silence(backends, how):
    timed, _ = backends
    built = [(lead, name) for lead in (1.0, 2.0) for name in ONSET_S]
    audio = [int16_to_float(np.concatenate([_silence(lead), speech.perturb(speech.samples(name),
                                            how), _silence(0.5)])) for lead, name in built]
    for (lead, name), hyp, buf in zip(built, timed.transcribe_batch(audio), audio, strict=True):
        _check_words(hyp, len(buf) / RATE)
        first = hyp.words[0]
        assert normalize(first.text)[0] == normalize(speech.text(name))[0], hyp.text
        assert abs(first.start - (lead + ONSET_S[name])) <= TOLERANCE_S, (lead, name, first)


@pytest.mark.parametrize("how", speech.STEPS, ids=speech.STEP_IDS)
def test_a_pause_between_two_clips_lies_between_their_words(backends, how):
    timed, _ = backends
    clips = {n: speech.perturb(speech.samples(n), how) for n in ONSET_S}
    audio = [int16_to_float(np.concatenate([clips[a], _silence(PAUSE_S), clips[b],
                                            _silence(0.5)])) for a, b in PAIRS]
    for (a, b), hyp, buf in zip(PAIRS, timed.transcribe_batch(audio), audio, strict=True):
        _check_words(hyp, len(buf) / RATE)
        # the words of the first clip: as many as its reference has, once normalised
        counts = np.cumsum([len(normalize(w.text)) for w in hyp.words])
        k = int(np.searchsorted(counts, len(normalize(speech.text(a))))) + 1
        before, after = hyp.words[k - 1], hyp.words[k]
        assert normalize(" ".join(w.text for w in hyp.words[:k])) == normalize(speech.text(a))
        pause_start = len(clips[a]) / RATE
        assert before.end <= pause_start + TOLERANCE_S, (a, b, before)
        assert abs(after.start - (pause_start + PAUSE_S + ONSET_S[b])) <= TOLERANCE_S, (a, b, after)
        assert after.start - before.end >= PAUSE_S - TOLERANCE_S


def test_word_times_do_not_depend_on_the_batch_or_the_workers(backends):
    from stages.asr.whisper import WhisperBackend

    timed, _ = backends
    audio = [speech.load_float(n) for n in ONSET_S]
    audio.append(int16_to_float(speech.joined(("kittens", "honest"), gap_s=PAUSE_S)[0]))
    batched = timed.transcribe_batch(audio)
    assert [timed.transcribe_batch([a])[0] for a in audio] == batched
    two = WhisperBackend(ASRConfig(workers=2), max_batch=2, word_times=True)
    assert two.capabilities.lanes == 2
    assert two.transcribe_batch(audio) == batched


def test_silence_and_noise_beside_speech_get_no_words(backends):
    timed, _ = backends
    hiss = _hiss(2.0, -40)  # reaches the model, which hears no words in it
    audio = [hiss, speech.load_float("honest"), np.zeros(0, np.float32), np.zeros(RATE, np.float32)]
    hyps = timed.transcribe_batch(audio)
    assert [bool(h.words) for h in hyps] == [False, True, False, False]
    assert [h.text for h in hyps] == ["", hyps[1].text, "", ""]
    _check_words(hyps[1], len(audio[1]) / RATE)


def test_a_prompt_changes_nothing_about_the_words_contract(backends):
    timed, _ = backends
    buf = speech.load_float("quilter")
    (hyp,) = timed.transcribe_batch([buf], ["The traveller asked himself a question."])
    assert hyp.words
    _check_words(hyp, len(buf) / RATE)


def test_rows_no_longer_wanted_are_not_decoded_nor_aligned(backends):
    timed, _ = backends
    hiss = _hiss(2.0, -40)
    audio = [speech.load_float("honest"), hiss, speech.load_float("kittens")]
    whole = timed.transcribe_batch(audio)
    kept = timed.transcribe_batch(audio, wanted=lambda: [False, True, True])
    # the kept rows (a wordless one among them) keep their text and word times
    assert kept[0].text == "" and not kept[0].words
    assert kept[1:] == whole[1:] and kept[2].words
