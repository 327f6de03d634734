"""The draft decoder (stages/asr/whisper_decoder.py): Whisper's text decoder in NumPy, checked
against CTranslate2's own float32 decoder on the same encoder output, and shown to give the
same transcript whatever draft it is handed."""

import struct

import numpy as np
import pytest
import speech

from agent.config import ASRConfig
from agent.errors import ConfigError

pytest.importorskip("ctranslate2")
pytest.importorskip("faster_whisper")

from stages.asr.whisper import WhisperBackend, embedded_model_dir  # noqa: E402
from stages.asr.whisper_decoder import DecoderFormatError, read_decoder_weights  # noqa: E402

NAMES = ("kittens", "quilter", "honest", "wizard")


@pytest.fixture(scope="module")
def reference() -> WhisperBackend:
    """CTranslate2 decoding in float32: the independent reference (encoder and decoder)."""
    be = WhisperBackend(ASRConfig(compute_type="float32", decoder="ctranslate2",
                                  sentence_ends=True))
    be.warmup()
    return be


@pytest.fixture(scope="module")
def draft() -> WhisperBackend:
    be = WhisperBackend(ASRConfig(decoder="draft", sentence_ends=True))
    be.warmup()
    return be


@pytest.fixture(scope="module")
def buffers() -> list[np.ndarray]:
    """Each clip whole and cut at 60% (as a partial reads it)."""
    out = []
    for name in NAMES:
        pcm = speech.load_float(name)
        out += [pcm, pcm[: len(pcm) * 3 // 5]]
    return out


def encoded(be: WhisperBackend, pcm: np.ndarray):  # noqa: ANN201 (a StorageView)
    feats = np.zeros((1, be._n_mels, be.window_frames(len(pcm))), np.float32)
    be._fill(feats, [pcm])
    return be._model.encode(be._ct2.StorageView.from_array(feats))


def test_decoder_choice(draft):
    assert draft.decoder == "draft" and draft.workers == 1
    assert WhisperBackend(ASRConfig()).decoder == "ctranslate2"  # the default
    # where it cannot run, draft says why
    with pytest.raises(ConfigError, match="beam_size"):
        WhisperBackend(ASRConfig(beam_size=2, decoder="draft"))
    with pytest.raises(ConfigError, match="several workers"):
        WhisperBackend(ASRConfig(workers=2, decoder="draft"))
    with pytest.raises(ConfigError, match="asr.decoder: expected one of"):
        WhisperBackend(ASRConfig(decoder="numpy"))


def test_matches_ctranslate2_float32_on_the_same_encoder_output(reference, draft, buffers):
    """Same tokens, scores, no-speech probabilities and per-step logits as CTranslate2's
    float32 decoder, fed the same (float32) encoder output. The margin: every step's chosen
    logit leads the runner-up by far more than the two decoders' largest difference, so no
    choice here rests on rounding."""
    text = draft._text
    worst = 0.0
    closest = np.inf
    for pcm in buffers:
        enc = encoded(reference, pcm)
        want = reference._generate(enc, [""], len(pcm))[0]
        prompt = reference._prompt("")
        got = text.decode(np.asarray(enc)[0], prompt, reference._max_length([prompt], len(pcm)),
                          logits=True)
        assert got.tokens[-1] == reference._eot
        assert got.tokens[:-1] == want.sequences_ids[0]
        assert got.score == pytest.approx(want.scores[0], abs=2e-3)
        assert got.no_speech_prob == pytest.approx(want.no_speech_prob, abs=2e-3)
        for mine, theirs in zip(got.logits, want.logits[0], strict=True):
            theirs = np.asarray(theirs).reshape(-1)
            finite = np.isfinite(mine)
            worst = max(worst, float(np.abs(mine[finite] - theirs[finite]).max()))
            top2 = np.sort(mine[finite])[-2:]
            closest = min(closest, float(top2[1] - top2[0]))
    assert worst < 0.02, worst
    assert closest > 10 * worst, (closest, worst)


def test_any_draft_gives_the_same_transcript(draft, buffers):
    """A draft changes how much is decoded in one pass, never what is decoded: its own
    tokens, the text with a word changed, with tokens dropped or added, another clip's
    tokens, or noise."""
    text = draft._text
    rng = np.random.default_rng(7)
    prompt = draft._prompt("")
    for k, pcm in enumerate(buffers):
        row = np.asarray(encoded(draft, pcm))[0]
        max_length = draft._max_length([prompt], len(pcm))
        plain = text.decode(row, prompt, max_length)
        assert plain.drafted == 0
        own = plain.tokens[:-1]
        other = text.decode(np.asarray(encoded(draft, buffers[k - 1]))[0], prompt,
                            max_length).tokens
        drafts = {
            "own": own,
            "own with its end": plain.tokens,
            "a word changed": [*own[:3], 1234, *own[4:]],
            "a token dropped": [*own[:2], *own[3:]],
            "a token added": [*own[:2], 262, *own[2:]],
            "the start only": own[: len(own) // 2],
            "another clip": other,
            "noise": rng.integers(0, 50000, 40).tolist(),
            "too long": own * 20,
        }
        for why, d in drafts.items():
            got = text.decode(row, prompt, max_length, draft=d)
            assert got.tokens == plain.tokens, why
            assert got.score == pytest.approx(plain.score, abs=1e-3), why
        # its own text is all taken from the draft: one pass decodes it
        assert text.decode(row, prompt, max_length, draft=own).drafted == len(own)
        # after a changed word the draft is picked up again
        changed = text.decode(row, prompt, max_length, draft=drafts["a word changed"])
        assert changed.drafted >= len(own) - 2


def test_a_stream_drafts_from_its_partials(draft, buffers):
    """Through the backend: a buffer's transcript is the next, longer buffer's draft (same
    start, same prompt), and the transcripts are what a backend with no drafts makes."""
    fresh = WhisperBackend(ASRConfig(decoder="draft", sentence_ends=True))
    pcm = speech.load_float("quilter")
    before = draft.drafted_tokens
    for end in (len(pcm) // 3, len(pcm) * 2 // 3, len(pcm)):
        fresh._drafts.clear()
        (got,), (want,) = draft.transcribe_batch([pcm[:end]]), fresh.transcribe_batch([pcm[:end]])
        assert (got.text, got.tokens) == (want.text, want.tokens)
        assert got.end_p == pytest.approx(want.end_p, abs=1e-3)
    assert draft.drafted_tokens - before >= 10
    # a new prompt is a new key: no draft from the text decoded without it
    before = draft.drafted_tokens
    draft.transcribe_batch([pcm], prompts=["Hello."])
    assert draft.drafted_tokens == before


def test_model_file_errors(tmp_path):
    weights = read_decoder_weights(embedded_model_dir() / "model.bin")
    assert weights["decoder/embeddings/weight"].shape == (51864, 384)
    assert weights["decoder/embeddings/weight"].dtype == np.float32
    short = tmp_path / "short.bin"
    short.write_bytes((embedded_model_dir() / "model.bin").read_bytes()[:5000])
    with pytest.raises(DecoderFormatError, match="ends early"):
        read_decoder_weights(short)
    other = tmp_path / "other.bin"
    name = b"TransformerSpec"
    other.write_bytes(struct.pack("I", 6) + struct.pack("H", len(name) + 1) + name + b"\0")
    with pytest.raises(DecoderFormatError, match="not a Whisper model"):
        read_decoder_weights(other)

