import json

import numpy as np
import pytest

from transports.websocket import codec


def test_audio_round_trip_keeps_every_sample():
    pcm = (np.arange(960) * 67 - 30000).astype(np.int16)  # 3 frames, negative and positive
    m = codec.decode(codec.encode_audio(pcm))
    assert isinstance(m, codec.AudioMessage)
    assert m.pcm.dtype == np.int16
    np.testing.assert_array_equal(m.pcm, pcm)


def test_decoded_audio_does_not_alias_the_receive_buffer():
    buf = bytearray(codec.encode_audio(np.full(320, 5, np.int16)))
    m = codec.decode(bytes(buf))
    buf[:] = b"\0" * len(buf)
    assert m.pcm[0] == 5 and m.pcm.flags.writeable


def test_event_round_trip():
    ev = {"type": "transcript", "final": True, "text": "héllo ✓", "t": 1.25}
    assert json.loads(codec.encode_event(ev)) == ev
    m = codec.decode(codec.encode_event({"type": "ping", "t": 3}))
    assert m == codec.ControlMessage("ping", {"type": "ping", "t": 3})


@pytest.mark.parametrize(
    "message, words",
    [
        (b"", "0 bytes"),
        (b"\0" * 639, "639 bytes"),
        (b"\0" * 641, "whole 20 ms frames"),
        (b"\0" * (codec.MAX_MESSAGE_BYTES + codec.FRAME_BYTES), "at most"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": 7}', 'string "type"'),
        ('{"type": "format_disk"}', "unknown event type 'format_disk'"),
        ('{"type": "ping", "pad": "' + "x" * codec.MAX_TEXT_BYTES + '"}', "at most 4096"),
    ],
)
def test_bad_messages_become_reasons_not_exceptions(message, words):
    m = codec.decode(message)
    assert isinstance(m, codec.BadMessage)
    assert words in m.reason


def test_random_bytes_never_raise():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(0, 3000))
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        m = codec.decode(data)
        assert isinstance(m, (codec.AudioMessage, codec.BadMessage))
        m = codec.decode(data.decode("latin-1"))
        assert isinstance(m, (codec.ControlMessage, codec.BadMessage))


def test_error_event_is_a_client_event():
    ev = codec.error_event("too big", fatal=True)
    assert ev == {"type": "error", "message": "too big", "stage": "transport", "fatal": True}


@pytest.mark.parametrize("text", [
    "[" * 5000 + "]" * 5000,  # nests past the parser's recursion limit
    '{"type": "ping", "t": ' + "[" * 2000 + "]" * 2000 + "}",
    '{"type": "ping", "t": NaN}',
    '{"type": "ping", "t": 1e999}',
])
def test_hostile_json_is_a_bad_message_not_an_exception(text: str) -> None:
    m = codec.decode_text(text[: codec.MAX_TEXT_BYTES])
    assert isinstance(m, codec.BadMessage) and "not valid JSON" in m.reason
