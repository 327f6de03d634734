"""Whisper's text decoder in NumPy, fed CTranslate2's encoder output, with greedy decoding that
checks a draft: the tokens an earlier call on the same stream decoded.

While a caller speaks, each partial re-reads the utterance from its start, and the pause's
transcript reads it once more: a few new words at the end of text the decoder has already
produced. CTranslate2 decodes greedily one token per step (~7 ms a step for tiny.en on an AVX2
EPYC; a known prefix is forced one step at a time too). Here the draft's tokens go through
the decoder in one batched pass — the prompt, ``<|startoftranscript|>``..., then the draft —
and the logits at every position say at once how far the draft is what greedy decoding would
choose; decoding goes on step by step from the first token that differs. The transcript is
greedy decoding of this decoder whatever the draft (a pass and a step round apart by ~1e-5,
far under the gaps between choices): a wrong draft costs ~10-20 ms of pass, never a word. Measured on an AVX2 EPYC with NumPy's BLAS on one
thread (the backend holds it there): a whole 3-8 s utterance's text, its earlier transcript
as the draft, in 45-88 ms with the encoder's keys and values, against 91-216 ms for
CTranslate2 on two threads to decode it; a step costs ~10 ms against CTranslate2's ~7.

The weights are read from the model directory's ``model.bin`` (CTranslate2's own format: float16
for the embedded tiny.en) and held as float32, the first matrix of each product transposed for
row-major products. Not thread-safe: one call at a time (the backend's lock).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# CTranslate2's binary format: the type ids of its variables
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_SQRT_HALF = np.float32(0.7071067811865476)
# Off the draft, the chosen token is looked for this far ahead in it (a word heard otherwise
# takes a token or two; further on, a common token such as "," would match by chance), and
# at most this many of the draft's tokens after it are checked in one pass.
LOOKAHEAD = 4
GUESS_TOKENS = 24


class DecoderFormatError(ValueError):
    """The model file is not a CTranslate2 Whisper model this decoder can read."""


def read_decoder_weights(path: Path) -> dict[str, np.ndarray]:
    """The ``decoder/...`` variables of a CTranslate2 ``model.bin``, as float32 arrays (with the
    aliases resolved). Raises :class:`DecoderFormatError` on anything else."""
    data = Path(path).read_bytes()
    at = 0

    def take(fmt: str) -> tuple:
        nonlocal at
        values = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return values

    def text() -> str:
        nonlocal at
        (n,) = take("H")
        s = data[at : at + n - 1].decode("utf-8")
        at += n
        return s

    try:
        (version,) = take("I")
        if version < 5:
            raise DecoderFormatError(f"{path}: CTranslate2 model format {version} is too old")
        spec = text()
        if spec != "WhisperSpec":
            raise DecoderFormatError(f"{path} holds a {spec}, not a Whisper model")
        take("I")  # the spec's revision
        (count,) = take("I")
        weights: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = text()
            (rank,) = take("B")
            dims = take("I" * rank)
            (dtype_id,) = take("B")
            (nbytes,) = take("I")
            if name.startswith("decoder/") and rank:
                dtype = _DTYPES.get(dtype_id)
                if dtype is None or dtype is np.int8:  # an int8 file keeps scales apart
                    raise DecoderFormatError(
                        f"{path}: {name} is stored as type {dtype_id}; this decoder reads "
                        "float16 or float32 weights (convert the model without quantization)")
                arr = np.frombuffer(data, dtype, nbytes // np.dtype(dtype).itemsize, at)
                weights[name] = arr.reshape(dims).astype(np.float32)
            at += nbytes
        (aliases,) = take("I")
        for _ in range(aliases):
            alias, target = text(), text()
            if target in weights:
                weights[alias] = weights[target]
    except (struct.error, ValueError) as exc:  # ValueError: a variable past the file's end
        if isinstance(exc, DecoderFormatError):
            raise
        raise DecoderFormatError(f"{path} ends early: not a complete CTranslate2 model") from exc
    if "decoder/embeddings/weight" not in weights:
        raise DecoderFormatError(f"{path} has no Whisper decoder")
    return weights


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26, |error| < 1.5e-7 (float32 keeps ~6e-8): Whisper's GELU is the
    # exact one, and NumPy has no erf
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
            + 0.254829592) * t
    return np.copysign(1.0 - poly * np.exp(-a * a), x)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * _SQRT_HALF))


def _norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * gamma + beta


def _softmax_rows(a: np.ndarray) -> np.ndarray:
    a = np.exp(a - a.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return a


@dataclass(slots=True)
class DecodeResult:
    """One buffer's decoding, shaped like what the backend reads of CTranslate2's result."""

    tokens: list[int]  # the generated tokens, the end-of-text token included when reached
    score: float  # their summed log-probability over their count less the end (CTranslate2's)
    no_speech_prob: float
    logits: list[np.ndarray] = field(default_factory=list)  # per generated token, when asked
    drafted: int = 0  # tokens of the draft that greedy decoding kept


@dataclass(slots=True)
class _Layer:
    norm1: tuple[np.ndarray, np.ndarray]
    qkv: tuple[np.ndarray, np.ndarray]
    out1: tuple[np.ndarray, np.ndarray]
    norm2: tuple[np.ndarray, np.ndarray]
    query: tuple[np.ndarray, np.ndarray]
    keys_values: tuple[np.ndarray, np.ndarray]
    out2: tuple[np.ndarray, np.ndarray]
    norm3: tuple[np.ndarray, np.ndarray]
    ffn_in: tuple[np.ndarray, np.ndarray]
    ffn_out: tuple[np.ndarray, np.ndarray]


class WhisperTextDecoder:
    """Greedy Whisper decoding in NumPy over an encoder output, checking a draft in one pass.

    ``suppress`` are never chosen; ``suppress_begin`` are not chosen as the first generated
    token (CTranslate2's ``suppress_blank``); ``no_speech`` is the token whose probability
    after ``<|startoftranscript|>`` is :attr:`DecodeResult.no_speech_prob`."""

    def __init__(self, model_file: Path, *, eot: int, sot: int, no_speech: int | None,
                 suppress: Sequence[int], suppress_begin: Sequence[int]) -> None:
        w = read_decoder_weights(model_file)

        def t(name: str) -> np.ndarray:
            return np.ascontiguousarray(w[name].T)

        def linear(prefix: str, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
            weight = t(prefix + "/weight")
            bias = w.get(prefix + "/bias", np.zeros(weight.shape[1], np.float32))
            return (weight * np.float32(scale), bias * np.float32(scale))

        def norm(prefix: str) -> tuple[np.ndarray, np.ndarray]:
            return (w[prefix + "/layer_norm/gamma"], w[prefix + "/layer_norm/beta"])

        self.out_proj = t("decoder/embeddings/weight")  # [dim, vocab]: logits = x @ out_proj
        self.dim, self.vocab = self.out_proj.shape
        self.positions = w["decoder/position_encodings/encodings"]
        self.max_positions = len(self.positions)
        heads = w.get("decoder/num_heads")
        self.heads = int(heads) if heads is not None and heads.size == 1 else self.dim // 64
        self.head_dim = self.dim // self.heads
        scale = self.head_dim ** -0.5  # folded into the queries' projection
        self.layers: list[_Layer] = []
        i = 0
        while f"decoder/layer_{i}/ffn/linear_0/weight" in w:
            p = f"decoder/layer_{i}/"
            qkv_w, qkv_b = linear(p + "self_attention/linear_0")
            qkv_w[:, : self.dim] *= np.float32(scale)
            qkv_b[: self.dim] *= np.float32(scale)
            self.layers.append(_Layer(
                norm1=norm(p + "self_attention"), qkv=(qkv_w, qkv_b),
                out1=linear(p + "self_attention/linear_1"), norm2=norm(p + "attention"),
                query=linear(p + "attention/linear_0", scale),
                keys_values=linear(p + "attention/linear_1"),
                out2=linear(p + "attention/linear_2"), norm3=norm(p + "ffn"),
                ffn_in=linear(p + "ffn/linear_0"), ffn_out=linear(p + "ffn/linear_1")))
            i += 1
        if not self.layers:
            raise DecoderFormatError(f"{model_file} has no decoder layers")
        self.final_norm = (w["decoder/layer_norm/gamma"], w["decoder/layer_norm/beta"])
        self.eot, self.sot, self.no_speech = eot, sot, no_speech
        self._suppress = np.array(sorted({t for t in suppress if 0 <= t < self.vocab}), np.intp)
        self._suppress_begin = np.array(
            sorted({t for t in suppress_begin if 0 <= t < self.vocab}), np.intp)
        shape = (self.heads, self.max_positions, self.head_dim)
        self._keys = [np.zeros(shape, np.float32) for _ in self.layers]
        self._values = [np.zeros(shape, np.float32) for _ in self.layers]

    # --- one buffer ---------------------------------------------------------------------------
    def decode(self, encoded: np.ndarray, prompt: Sequence[int], max_length: int,
               draft: Sequence[int] = (), logits: bool = False) -> DecodeResult:
        """Greedy decoding of one buffer: ``encoded`` its encoder output ``[frames, dim]``,
        ``prompt`` the tokens up to and including the last of the start-of-transcript sequence,
        ``max_length`` CTranslate2's limit of the same name (the tokens decoded: see below). ``draft``:
        tokens expected to follow the prompt (an earlier transcript of the same audio's start);
        only what greedy decoding would choose of it is kept."""
        prompt = list(prompt)
        # CTranslate2's budget, measured on 4.8.5 (its Whisper decodes at most this many
        # tokens before the end-of-text token): max_length counts the prompt less one, and
        # never more than half of it is decoded
        room = min(max_length - len(prompt) + 1, max_length // 2,
                   self.max_positions - len(prompt))
        if not prompt or room < 1:
            raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room under "
                             f"max_length {max_length}")
        cross = self._cross(encoded)
        draft = [int(t) for t in draft[: room - 1]]
        if self.eot in draft:
            draft = draft[: draft.index(self.eot)]
        # One pass over the prompt and the draft: row k of ``out`` is the distribution of the
        # token after input k.
        out = self._forward(prompt + draft, 0, cross)
        sot_at = prompt.index(self.sot) if self.sot in prompt else None
        no_speech_prob = 0.0
        if sot_at is not None and self.no_speech is not None:
            row = out[sot_at].astype(np.float64)
            p = np.exp(row - row.max())
            no_speech_prob = float(p[self.no_speech] / p.sum())
        rows = out[len(prompt) - 1 :]  # row j: the choice of generated token j
        guess = draft  # the tokens the rows after the first were computed for
        base = 0  # where in the draft the guess starts
        tokens: list[int] = []
        total = 0.0
        kept: list[np.ndarray] = []
        drafted = 0
        j = 0
        while True:
            row = self._allowed(rows[j], first=not tokens)
            choice = int(row.argmax())
            total += _log_prob(row, choice)
            if logits:
                kept.append(row)
            tokens.append(choice)
            if choice == self.eot or len(tokens) >= room:
                break
            if j < len(guess) and choice == guess[j]:
                drafted += 1
                j += 1
                continue
            # Off the draft (or past it): where the draft's text goes on after this token —
            # a word the longer audio heard otherwise, then the same words again — is the
            # next guess, checked in the same pass as the step for this token.
            base += j
            guess = []
            for k in range(base, min(base + LOOKAHEAD, len(draft))):
                if draft[k] == choice:
                    base = k + 1
                    guess = draft[base : base + min(GUESS_TOKENS, room - len(tokens) - 1)]
                    break
            rows = self._forward([choice, *guess], len(prompt) + len(tokens) - 1, cross)
            j = 0
        # CTranslate2's greedy score: the log-probabilities summed, the end-of-text token's
        # included, over the count of the others
        words = len(tokens) - (tokens[-1] == self.eot)
        return DecodeResult(tokens, total / max(1, words), no_speech_prob, kept, drafted)

    # --- internals ----------------------------------------------------------------------------
    def _allowed(self, row: np.ndarray, first: bool) -> np.ndarray:
        row = row.copy()
        row[self._suppress] = -np.inf
        if first:
            row[self._suppress_begin] = -np.inf
        return row

    def _cross(self, encoded: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each layer's keys ``[heads, head_dim, frames]`` and values ``[heads, frames,
        head_dim]`` over the encoder output."""
        enc = np.asarray(encoded, dtype=np.float32)
        frames = enc.shape[0]
        h, d = self.heads, self.head_dim
        cross = []
        for layer in self.layers:
            kv = enc @ layer.keys_values[0] + layer.keys_values[1]
            keys = np.ascontiguousarray(kv[:, : self.dim].reshape(frames, h, d).transpose(1, 2, 0))
            values = np.ascontiguousarray(kv[:, self.dim :].reshape(frames, h, d).transpose(1, 0, 2))
            cross.append((keys, values))
        return cross

    def _forward(self, tokens: list[int], start: int,
                 cross: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Logits ``[len(tokens), vocab]`` for ``tokens`` at positions ``start``...; their
        keys and values replace the cache's from ``start`` on."""
        n = len(tokens)
        end = start + n
        h, d, dim = self.heads, self.head_dim, self.dim
        x = self.out_proj[:, tokens].T + self.positions[start:end]
        mask = np.triu(np.full((n, end), -np.inf, np.float32), start + 1) if n > 1 else None
        for layer, keys, values, (cross_keys, cross_values) in zip(
                self.layers, self._keys, self._values, cross, strict=True):
            qkv = _norm(x, *layer.norm1) @ layer.qkv[0] + layer.qkv[1]
            q = qkv[:, :dim].reshape(n, h, d).transpose(1, 0, 2)
            keys[:, start:end] = qkv[:, dim : 2 * dim].reshape(n, h, d).transpose(1, 0, 2)
            values[:, start:end] = qkv[:, 2 * dim :].reshape(n, h, d).transpose(1, 0, 2)
            a = q @ keys[:, :end].transpose(0, 2, 1)
            if mask is not None:
                a += mask
            a = _softmax_rows(a) @ values[:, :end]
            x = x + a.transpose(1, 0, 2).reshape(n, dim) @ layer.out1[0] + layer.out1[1]
            q = _norm(x, *layer.norm2) @ layer.query[0] + layer.query[1]
            a = _softmax_rows(q.reshape(n, h, d).transpose(1, 0, 2) @ cross_keys) @ cross_values
            x = x + a.transpose(1, 0, 2).reshape(n, dim) @ layer.out2[0] + layer.out2[1]
            hidden = _gelu(_norm(x, *layer.norm3) @ layer.ffn_in[0] + layer.ffn_in[1])
            x = x + hidden @ layer.ffn_out[0] + layer.ffn_out[1]
        return _norm(x, *self.final_norm) @ self.out_proj


def _log_prob(row: np.ndarray, k: int) -> float:
    """log softmax(row)[k] in float64 (``row`` may hold -inf)."""
    r = row.astype(np.float64)
    top = r.max()
    return float(r[k] - top - np.log(np.exp(r - top).sum()))


__all__ = ["DecodeResult", "DecoderFormatError", "WhisperTextDecoder", "read_decoder_weights"]
