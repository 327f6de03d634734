"""G.711 μ-law (PCMU, RTP payload type 0) and A-law (PCMA, type 8): int16 PCM ↔ 8-bit codes.

Both directions are table look-ups built once at import from the ITU-T G.711 segment rules, so
encoding or decoding a 20 ms packet is one numpy fancy-index (no Python loop per sample).
"""

from __future__ import annotations

import numpy as np

_ALL_INT16 = np.arange(-32768, 32768, dtype=np.int32)
# segment end points of the compressed magnitude (μ-law: 14-bit input, A-law: 13-bit input)
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)
_ULAW_BIAS = 0x21  # 33 in 14-bit units: shifts every segment to start at a power of two
_ULAW_CLIP = 8159


def _ulaw_encode_table() -> np.ndarray:
    pcm = _ALL_INT16 >> 2  # G.711 μ-law works on 14-bit samples
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), _ULAW_CLIP) + _ULAW_BIAS
    seg = np.searchsorted(_ULAW_SEG_END, mag)  # first segment whose end >= mag
    code = np.where(
        seg >= 8, 0x7F, (seg << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0x0F)
    )
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF  # codes are sent inverted
    exp, mantissa = (u >> 4) & 0x07, u & 0x0F
    mag = (((mantissa << 3) + 0x84) << exp) - 0x84
    return np.where(u & 0x80, -mag, mag).astype(np.int16)


def _alaw_encode_table() -> np.ndarray:
    pcm = _ALL_INT16 >> 3  # G.711 A-law works on 13-bit samples
    mask = np.where(pcm >= 0, 0xD5, 0x55)  # sign bit, plus the even-bit inversion (0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(_ALAW_SEG_END, mag)
    shift = np.where(seg < 2, 1, seg)
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | ((mag >> shift) & 0x0F))
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exp, mantissa = (a >> 4) & 0x07, a & 0x0F
    mag = np.where(
        exp == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exp - 1, 0)
    )
    return np.where(a & 0x80, mag, -mag).astype(np.int16)


# indexed by the int16 sample reinterpreted as uint16 (so -1 is 0xFFFF)
_ULAW_ENC = np.roll(_ulaw_encode_table(), -32768)
_ALAW_ENC = np.roll(_alaw_encode_table(), -32768)
ULAW_TO_PCM = _ulaw_decode_table()
ALAW_TO_PCM = _alaw_decode_table()
ULAW_SILENCE = int(_ULAW_ENC[0])
ALAW_SILENCE = int(_ALAW_ENC[0])


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → μ-law bytes (bit-exact with the ITU-T G.711 reference encoder)."""
    return _ULAW_ENC[np.asarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes → int16 samples."""
    return ULAW_TO_PCM[np.frombuffer(data, dtype=np.uint8)]


def alaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → A-law bytes."""
    return _ALAW_ENC[np.asarray(pcm, dtype=np.int16).view(np.uint16)].tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes → int16 samples."""
    return ALAW_TO_PCM[np.frombuffer(data, dtype=np.uint8)]


class G711Codec:
    """The encoder/decoder pair of one G.711 law, as an RTP payload type knows it."""

    __slots__ = ("name", "payload_type", "encode", "decode", "silence")

    def __init__(self, law: str) -> None:
        if law == "PCMU":
            self.payload_type, self.encode, self.decode = 0, ulaw_encode, ulaw_decode
            self.silence = ULAW_SILENCE
        elif law == "PCMA":
            self.payload_type, self.encode, self.decode = 8, alaw_encode, alaw_decode
            self.silence = ALAW_SILENCE
        else:
            raise ValueError(f"unknown G.711 law {law!r} (PCMU or PCMA)")
        self.name = law


PCMU = G711Codec("PCMU")
PCMA = G711Codec("PCMA")
CODECS_BY_PT: dict[int, G711Codec] = {0: PCMU, 8: PCMA}
