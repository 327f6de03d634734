"""G.711 μ-law and A-law, bit-exact against tables computed here, sample by sample, from the
ITU-T G.711 definition (segment/quantisation rules), independently of the vectorised codec."""

from __future__ import annotations

import numpy as np
import pytest

from transports import g711


def ref_ulaw_encode(x: int) -> int:
    # G.711 μ-law on 14-bit magnitudes: bias 33, 8 segments of 16 steps, codes sent inverted
    v = x >> 2
    sign = 0x80 if v < 0 else 0
    mag = min(-v if v < 0 else v, 8159) + 33
    seg = 0
    while seg < 8 and mag > (64 << seg) - 1:
        seg += 1
    code = 0x7F if seg >= 8 else (seg << 4) | ((mag >> (seg + 1)) & 0x0F)
    return (code | sign) ^ 0xFF


def ref_ulaw_decode(code: int) -> int:
    u = ~code & 0xFF
    seg, step = (u >> 4) & 7, u & 0x0F
    mag = ((2 * step + 33) << seg) - 33  # the midpoint of the quantisation interval
    return -4 * mag if u & 0x80 else 4 * mag


def ref_alaw_encode(x: int) -> int:
    # G.711 A-law on 13-bit values: segment 0 and 1 share a step size, even bits inverted
    v = x >> 3
    if v >= 0:
        sign, mag = 0x80, v
    else:
        sign, mag = 0x00, -v - 1
    seg = 0
    while seg < 8 and mag > (32 << seg) - 1:
        seg += 1
    if seg >= 8:
        code = 0x7F
    elif seg < 2:
        code = (seg << 4) | ((mag >> 1) & 0x0F)
    else:
        code = (seg << 4) | ((mag >> seg) & 0x0F)
    return (code | sign) ^ 0x55


def ref_alaw_decode(code: int) -> int:
    a = code ^ 0x55
    seg, step = (a >> 4) & 7, a & 0x0F
    mag = (2 * step + 1) << 3 if seg == 0 else ((2 * step + 33) << (seg + 2))
    return mag if a & 0x80 else -mag


ALL = np.arange(-32768, 32768, dtype=np.int16)
CODES = bytes(range(256))


def test_ulaw_encoder_matches_definition_for_every_int16() -> None:
    want = bytes(ref_ulaw_encode(int(x)) for x in ALL)
    assert g711.ulaw_encode(ALL) == want


def test_alaw_encoder_matches_definition_for_every_int16() -> None:
    want = bytes(ref_alaw_encode(int(x)) for x in ALL)
    assert g711.alaw_encode(ALL) == want


@pytest.mark.parametrize(("decode", "ref"), [(g711.ulaw_decode, ref_ulaw_decode),
                                             (g711.alaw_decode, ref_alaw_decode)])
def test_decoders_match_definition_for_every_code(decode, ref) -> None:
    assert decode(CODES).tolist() == [ref(c) for c in CODES]


@pytest.mark.parametrize(("enc", "dec"), [(g711.ulaw_encode, g711.ulaw_decode),
                                          (g711.alaw_encode, g711.alaw_decode)])
def test_decode_then_encode_is_identity_on_codes(enc, dec) -> None:
    # every code decodes to a value that encodes back to the same code (μ-law: but for the
    # two zero codes 0x7F/0xFF, which both decode to 0 and encode to 0xFF)
    round_trip = enc(dec(CODES))
    diff = [c for c in range(256) if round_trip[c] != c]
    assert diff in ([], [0x7F])


def test_known_values() -> None:
    assert g711.ULAW_SILENCE == 0xFF and g711.ALAW_SILENCE == 0xD5
    assert g711.ulaw_encode(np.array([32767, -32768], np.int16)) == bytes([0x80, 0x00])
    assert g711.alaw_encode(np.array([32767, -32768], np.int16)) == bytes([0xAA, 0x2A])


def test_codec_by_payload_type() -> None:
    assert g711.CODECS_BY_PT[0] is g711.PCMU and g711.CODECS_BY_PT[8] is g711.PCMA
    with pytest.raises(ValueError):
        g711.G711Codec("G722")
