"""Twilio Media Streams messages: the documented JSON shapes, round trips both ways, malformed
messages raising ``TwilioMessageError`` only; and the TwiML for <Connect><Stream>."""

from __future__ import annotations

import contextlib
import json
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports.twilio.messages import (
    Clear,
    Connected,
    DtmfDigit,
    MarkEcho,
    Media,
    SendMark,
    SendMedia,
    Start,
    Stop,
    TwilioMessageError,
    parse_command,
    parse_message,
)
from transports.twilio.twiml import connect_stream_twiml

SID = "MZ" + "ab" * 16


def test_documented_start_message() -> None:
    raw = json.dumps({
        "event": "start", "sequenceNumber": "1", "streamSid": SID,
        "start": {"accountSid": "AC1", "streamSid": SID, "callSid": "CA1",
                  "tracks": ["inbound"], "customParameters": {"who": "me"},
                  "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                  "channels": 1}},
    })
    msg = parse_message(raw)
    assert msg == Start(SID, "CA1", "AC1", ("inbound",), {"who": "me"}, sequence=1)


def test_documented_media_message() -> None:
    raw = ('{"event":"media","sequenceNumber":"3","media":{"track":"inbound","chunk":"1",'
           '"timestamp":"5","payload":"/w=="},"streamSid":"' + SID + '"}')
    assert parse_message(raw) == Media(SID, b"\xff", 1, 5, "inbound", 3)


def test_outbound_shapes() -> None:
    assert json.loads(SendMedia(SID, b"\xff\x7f").to_json()) == {
        "event": "media", "streamSid": SID, "media": {"payload": "/38="}}
    assert json.loads(SendMark(SID, "u1:start").to_json()) == {
        "event": "mark", "streamSid": SID, "mark": {"name": "u1:start"}}
    assert json.loads(Clear(SID).to_json()) == {"event": "clear", "streamSid": SID}


inbound = st.one_of(
    st.builds(Connected),
    st.builds(Start, st.text(min_size=1), st.text(), st.text(),
              st.lists(st.text(), min_size=1, max_size=2).map(tuple),
              st.dictionaries(st.text(), st.text(), max_size=3),
              sequence=st.integers(0, 10**6)),
    st.builds(Media, st.text(), st.binary(max_size=320), st.integers(0, 10**6),
              st.integers(0, 10**9), sequence=st.integers(0, 10**6)),
    st.builds(DtmfDigit, st.text(), st.sampled_from(list("0123456789*#")),
              sequence=st.integers(0, 10**6)),
    st.builds(MarkEcho, st.text(), st.text(), st.integers(0, 10**6)),
    st.builds(Stop, st.text(), st.text(), st.text(), st.integers(0, 10**6)),
)
outbound = st.one_of(
    st.builds(SendMedia, st.text(), st.binary(max_size=320)),
    st.builds(SendMark, st.text(), st.text()),
    st.builds(Clear, st.text()),
)


@given(inbound)
def test_inbound_round_trip(msg) -> None:
    assert parse_message(msg.to_json()) == msg


@given(outbound)
def test_outbound_round_trip(msg) -> None:
    assert parse_command(msg.to_json()) == msg


@pytest.mark.parametrize("raw", [
    "", "not json", "[]", '{"no":"event"}', '{"event":"bogus"}',
    '{"event":"media","streamSid":"x"}',
    '{"event":"media","streamSid":"x","media":{"payload":"%%%"}}',
    '{"event":"media","streamSid":"x","media":{"payload":"/w==","chunk":"one"}}',
    '{"event":"mark","streamSid":"x","mark":{}}',
    '{"event":"start","start":{"streamSid":"x","tracks":"inbound"}}',
    '{"event":"dtmf","dtmf":{"digit":null}}',
    '{"event":"media","media":{"payload":"' + "A" * 70000 + '"}}',
    # found by the security review: each ended the call with an unexpected exception
    '{"event":"mark","sequenceNumber":Infinity,"streamSid":"x","mark":{"name":"a"}}',
    '{"event":"mark","sequenceNumber":1e999,"streamSid":"x","mark":{"name":"a"}}',
    '{"event":"mark","sequenceNumber":NaN,"streamSid":"x","mark":{"name":"a"}}',
    '{"event":"media","media":' + "[" * 5000 + "]" * 5000 + "}",
    b'{"event":"stop","streamSid":"\xff"}',
])
def test_malformed_messages(raw: str) -> None:
    with pytest.raises(TwilioMessageError):
        parse_message(raw)


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300),
                 st.dictionaries(st.sampled_from(["event", "media", "mark", "start", "dtmf"]),
                                 st.one_of(st.text(), st.integers(), st.none(),
                                           st.sampled_from(["media", "start", "mark"])))
                 .map(json.dumps)))
def test_arbitrary_input_parses_or_raises_twilio_message_error(raw) -> None:
    with contextlib.suppress(TwilioMessageError):
        parse_message(raw)


def test_twiml() -> None:
    xml = connect_stream_twiml("wss://bot.example.com/twilio/media?x=1&y=2", {"lang": "en"})
    root = ET.fromstring(xml)
    stream = root.find("./Connect/Stream")
    assert root.tag == "Response" and stream is not None
    assert stream.get("url") == "wss://bot.example.com/twilio/media?x=1&y=2"
    assert stream.find("Parameter").attrib == {"name": "lang", "value": "en"}
    with pytest.raises(ValueError):
        connect_stream_twiml("https://not-a-websocket")
