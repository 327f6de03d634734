"""The asr-serve socket codec: round trips, byte-stream splits, limits, and garbage."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.asr import wire
from stages.asr.wire import (
    Audio,
    Decoder,
    End,
    Error,
    ErrorCode,
    Final,
    Flag,
    Open,
    Partial,
    SharedMemoryFile,
    SpeechEvent,
    VADEvent,
)

streams = st.integers(min_value=0, max_value=0xFFFF_FFFF)
texts = st.text(max_size=200)
messages = st.one_of(
    st.builds(Open, streams, st.dictionaries(st.text(max_size=10), st.integers() | st.booleans() | texts, max_size=4)),
    st.builds(Audio, streams, st.binary(max_size=600).map(lambda b: b[: len(b) & ~1])),
    st.builds(End, streams),
    st.builds(SharedMemoryFile, streams, st.text(min_size=1, max_size=40),
              st.integers(0, 2**63), st.integers(0, 2**63)),
    st.builds(VADEvent, streams, st.sampled_from(list(SpeechEvent)), st.integers(0, 2**63),
              st.integers(0, 2**63)),
    st.builds(Partial, streams, texts, st.integers(0, 2**63)),
    st.builds(Final, streams, texts, st.integers(0, 2**63)),
    # a sentence end is carried in 65,535ths: these values come back exactly
    st.builds(Final, streams, texts, st.integers(0, 2**63),
              end_p=st.integers(0, wire.END_P_SCALE).map(lambda k: k / wire.END_P_SCALE)),
    st.builds(Error, streams, st.sampled_from(list(ErrorCode)), texts),
)


def test_a_pause_carries_where_the_voice_stopped_and_an_old_pause_reads_as_unknown():
    new, old = Decoder().feed(wire.encode_pause(1, 7680, 7200) + wire.encode_event(
        1, SpeechEvent.PAUSED, 7680))
    assert (new.event, new.at, new.voice_end) == (SpeechEvent.PAUSED, 7680, 7200)
    assert old.voice_end == -1  # a client that sends no voice end
    assert Decoder().feed(wire.encode_pause(1, 7680, 0))[0].voice_end == 0
    assert Decoder().feed(wire.encode_pause(1, 7680))[0].voice_end == -1


def test_each_message_round_trips():
    msgs = [
        Open(1, {"partials": False, "file": True}),
        Audio(1, b"\x01\x00\xff\x7f"),
        End(1),
        SharedMemoryFile(2, "psm_abc", 9_600_000, 4_800_000),
        Partial(1, "hello wor", 8000),
        VADEvent(1, SpeechEvent.PAUSED, 7680),
        VADEvent(1, SpeechEvent.STOPPED, 8000, 1600),
        Partial(1, "hello world", 8000, 1600, 5, Flag.SPECULATIVE),
        Final(1, "hello world — ünïcode", 16000),
        Final(1, "hello world — ünïcode", 16000, 1600, 21, Flag.LAST),
        Error(0, ErrorCode.PROTOCOL, "bad frame"),
    ]
    data = b"".join(wire.encode(m) for m in msgs)
    dec = Decoder()
    assert dec.feed(data) == msgs
    assert dec.error is None and dec.buffered == 0


def test_frame_layout_is_length_type_stream_payload():
    frame = wire.encode_audio(7, b"\x01\x02")
    assert frame == struct.pack(">IBI", 7, wire.Kind.AUDIO, 7) + b"\x01\x02"


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, max_size=12), st.data())
def test_any_split_of_the_byte_stream_decodes_the_same(msgs, data):
    stream = b"".join(wire.encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    dec = Decoder()
    got = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        got += dec.feed(stream[prev:cut])
        prev = cut
    assert got == msgs
    assert dec.error is None and dec.buffered == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.lists(st.integers(1, 64), max_size=30))
def test_garbage_never_raises(blob, sizes):
    dec = Decoder(max_message=4096)
    at = 0
    for n in [*sizes, len(blob)]:
        out = dec.feed(blob[at : at + n])
        assert isinstance(out, list)
        at += n
    # either it is still waiting for the rest of a frame, or it flagged a clear error
    assert dec.error is None or str(dec.error)


def test_oversized_length_is_refused_from_the_header_alone():
    dec = Decoder(max_message=1000)
    assert dec.feed(struct.pack(">I", 1_000_000)) == []
    assert "exceeds the 1000-byte message limit" in str(dec.error)
    assert dec.buffered == 0


def test_messages_before_a_violation_are_kept_and_nothing_after():
    good = wire.encode_end(3)
    bad = struct.pack(">IBI", 5, 99, 3)  # unknown message type
    dec = Decoder()
    assert dec.feed(good + bad + good) == [End(3)]
    assert "unknown message type 99" in str(dec.error)
    assert dec.feed(good) == []  # a broken stream stays broken


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (struct.pack(">IBI", 4, 1, 0)[:8], "below the 5-byte minimum"),
        (struct.pack(">IBI", 6, wire.Kind.AUDIO, 1) + b"\x00", "not whole PCM16 samples"),
        (struct.pack(">IBI", 7, wire.Kind.OPEN, 1) + b"[]", "must be a JSON object"),
        (struct.pack(">IBI", 7, wire.Kind.OPEN, 1) + b"{x", "not valid JSON"),
        (struct.pack(">IBI", 6, wire.Kind.END, 1) + b"x", "END carries no payload"),
        (struct.pack(">IBI", 9, wire.Kind.SHM, 1) + b"\0" * 4, "SHM payload too short"),
        (struct.pack(">IBI", 7, wire.Kind.ERROR, 1) + b"\x00\x63", "unknown error code 99"),
        (struct.pack(">IBI", 27, wire.Kind.FINAL, 1) + b"\0" * 21 + b"\xff", "not valid UTF-8"),
        (struct.pack(">IBI", 26, wire.Kind.PARTIAL, 1) + struct.pack(">QQIB", 1, 0, 1, 0),
         "bad stable count"),
        (struct.pack(">IBI", 27, wire.Kind.PARTIAL, 1) + struct.pack(">QQIB", 1, 0, 0, 8) + b"a",
         "bad stable count or flags"),
        (struct.pack(">IBI", 27, wire.Kind.FINAL, 1) + struct.pack(">QQIB", 1, 0, 0, 4) + b"\x01",
         "END_P has no room for it"),
        (struct.pack(">IBI", 22, wire.Kind.EVENT, 1) + struct.pack(">BQQ", 9, 0, 0),
         "unknown speech event 9"),
        (struct.pack(">IBI", 6, wire.Kind.EVENT, 1) + b"\x01", "EVENT payload is 17 bytes"),
    ],
)
def test_malformed_frames_get_a_clear_error(frame, reason):
    dec = Decoder()
    assert dec.feed(frame) == []
    assert reason in str(dec.error)


def test_deeply_nested_options_are_a_protocol_error_not_a_crash():
    payload = b"[" * 50_000
    dec = Decoder()
    dec.feed(struct.pack(">IBI", len(payload) + 5, wire.Kind.OPEN, 1) + payload)
    assert "not valid JSON" in str(dec.error)


def test_a_truncated_frame_waits_for_the_rest():
    frame = wire.encode_final(2, "partial delivery", 480)
    dec = Decoder()
    assert dec.feed(frame[:-3]) == []
    assert dec.error is None and dec.buffered == len(frame) - 3
    assert dec.feed(frame[-3:]) == [Final(2, "partial delivery", 480, 0, 16, Flag.LAST)]


def test_long_audio_is_split_into_frames_within_the_limit():
    pcm = bytes(range(256)) * 100  # 25 600 bytes
    frames = wire.encode_audio_chunks(5, pcm, max_message=1001)
    assert all(len(f) - 4 <= 1001 for f in frames)
    got = Decoder(max_message=1001).feed(b"".join(frames))
    assert b"".join(m.pcm for m in got) == pcm


def test_encoding_refuses_odd_audio_and_bad_stream_ids():
    with pytest.raises(ValueError):
        wire.encode_audio(1, b"\x00")
    with pytest.raises(ValueError):
        wire.encode_end(-1)


def test_shared_memory_names_carry_the_clients_pid_and_no_path():
    name = wire.shm_name(4242, "0123456789abcdef")
    assert name == "voxline-asr-4242-0123456789abcdef"
    assert wire.shm_name_ok(name, 4242) and wire.shm_name_ok(name, None)
    assert not wire.shm_name_ok(name, 4243)  # another process's
    for bad in ("psm_1234abcd", "voxline-asr-4242-../../etc", "/voxline-asr-4242-0123456789abcdef",
                "voxline-asr-4242-0123456789ABCDEF", "voxline-asr-4242-0123", "voxline-asr--abcdefgh",
                "voxline-asr-4242-0123456789abcdef\0", "voxline-asr-٤٢-0123456789abcdef"):
        assert not wire.shm_name_ok(bad, None), bad
    with pytest.raises(ValueError):
        wire.shm_name(1, "not hex!")


def test_the_limit_and_forbidden_codes_round_trip():
    for code in (wire.ErrorCode.LIMIT, wire.ErrorCode.FORBIDDEN):
        (msg,) = Decoder().feed(wire.encode_error(0, code, "no"))
        assert msg == Error(0, code, "no")


def test_a_sentence_end_rides_on_a_result_only_where_given():
    plain = wire.encode_final(4, "Go on.", 16000)
    told = wire.encode_final(4, "Go on.", 16000, end_p=0.75)
    # without it the frame is the layout every client knows, byte for byte
    assert len(plain) == wire.HEADER_SIZE + 21 + len("Go on.")
    assert plain[wire.HEADER_SIZE + 20] == Flag.LAST
    assert len(told) == len(plain) + 2 and told[wire.HEADER_SIZE + 20] == Flag.LAST | Flag.END_P
    (a,), (b,) = Decoder().feed(plain), Decoder().feed(told)
    assert a.end_p is None and a.flags == b.flags == Flag.LAST and a.text == b.text == "Go on."
    assert abs(b.end_p - 0.75) <= 1 / wire.END_P_SCALE
    (p,) = Decoder().feed(wire.encode_partial(4, "Go on", 8000, 0, 2, Flag.SPECULATIVE, 0.0))
    assert p.speculative and p.end_p == 0.0 and p.stable == 2
    # the flag follows end_p, whatever flags the caller passed; out-of-range values are clamped
    (c,) = Decoder().feed(wire.encode_final(4, "x", 1, flags=Flag.LAST | Flag.END_P))
    assert c.end_p is None
    assert [m.end_p for m in Decoder().feed(wire.encode_final(4, "x", 1, end_p=1.7)
                                            + wire.encode_final(4, "x", 1, end_p=-0.2))] == [1.0, 0.0]
