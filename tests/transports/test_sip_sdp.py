"""SDP offer/answer: codec choice, telephone-event, and offers we must refuse."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sip_requests import SDP_OFFER

from transports.sip.sdp import SdpError, build_answer, choose, parse_offer


def test_offer_and_answer() -> None:
    offer = parse_offer(SDP_OFFER.encode())
    assert (offer.address, offer.port, offer.payload_types) == ("127.0.0.1", 6000, (0, 8, 101))
    ans = choose(offer)
    assert (ans.codec, ans.payload_type, ans.telephone_event) == ("PCMU", 0, 101)
    sdp = build_answer(ans, "127.0.0.1", 40000).decode()
    assert "m=audio 40000 RTP/AVP 0 101" in sdp and "a=rtpmap:101 telephone-event/8000" in sdp
    back = parse_offer(sdp.encode())
    assert back.port == 40000 and back.telephone_event() == 101


def test_alaw_only_and_preference() -> None:
    offer = parse_offer(SDP_OFFER.replace("RTP/AVP 0 8 101", "RTP/AVP 8").encode())
    assert choose(offer).codec == "PCMA" and choose(offer).telephone_event is None
    both = parse_offer(SDP_OFFER.encode())
    assert choose(both, ("PCMA", "PCMU")).codec == "PCMA"


def test_media_level_connection_wins() -> None:
    sdp = SDP_OFFER.replace("t=0 0", "t=0 0").replace(
        "a=rtpmap:0 PCMU/8000", "c=IN IP4 10.0.0.9\r\na=rtpmap:0 PCMU/8000")
    assert parse_offer(sdp.encode()).address == "10.0.0.9"


@pytest.mark.parametrize("sdp", [
    SDP_OFFER.replace("RTP/AVP 0 8 101", "RTP/AVP 9 101"),  # G.722 only
    SDP_OFFER.replace("m=audio 6000", "m=audio 0"),  # stream disabled
    SDP_OFFER.replace("m=audio", "m=video"),  # no audio
    SDP_OFFER.replace("RTP/AVP", "RTP/SAVP"),  # SRTP: not yet
    SDP_OFFER.replace("c=IN IP4 127.0.0.1\r\n", ""),  # no address
    "",
])
def test_offers_we_refuse(sdp: str) -> None:
    with pytest.raises(SdpError):
        choose(parse_offer(sdp.encode()))


@given(st.binary(max_size=1000))
def test_arbitrary_bodies_parse_or_raise_sdp_error(body: bytes) -> None:
    with contextlib.suppress(SdpError):
        choose(parse_offer(body))
