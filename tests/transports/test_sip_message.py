"""The SIP parser/serializer: round trips, compact headers, folding, and every malformed input
rejected with the status a UAS answers it with."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sip_requests import SDP_OFFER, request

from transports.sip.message import (
    MAX_MESSAGE_BYTES,
    SipMessage,
    SipParseError,
    parse_sip,
    response_to,
    uri_user,
)


def test_parse_invite() -> None:
    msg = parse_sip(request("INVITE", body=SDP_OFFER))
    assert msg.method == "INVITE" and msg.uri == "sip:agent@127.0.0.1:5060"
    assert msg.call_id == "abc@127.0.0.1" and msg.cseq == (1, "INVITE")
    assert msg.body == SDP_OFFER.encode()


def test_compact_forms_folding_and_case() -> None:
    raw = (b"OPTIONS sip:a@b SIP/2.0\r\nv: SIP/2.0/UDP h;branch=z9hG4bKx\r\nf: <sip:x@y>;tag=1\r\n"
           b"t: <sip:a@b>\r\ni: cid\r\ncseq: 9 OPTIONS\r\nSubject: one\r\n  two\r\nl: 0\r\n\r\n")
    msg = parse_sip(raw)
    assert msg.header("Via").startswith("SIP/2.0/UDP") and msg.call_id == "cid"
    assert msg.header("subject") == "one two" and msg.cseq == (9, "OPTIONS")


def test_bytes_after_the_declared_body_are_discarded() -> None:
    msg = parse_sip(request("INVITE", body=SDP_OFFER + "garbage", content_length=len(SDP_OFFER)))
    assert msg.body == SDP_OFFER.encode()


@pytest.mark.parametrize(("raw", "status"), [
    (request("INVITE", body=SDP_OFFER, drop=("Call-ID",)), 400),
    (request("INVITE", body=SDP_OFFER, drop=("Via",)), 400),
    (request("BYE", drop=("CSeq",)), 400),
    (request("INVITE", body=SDP_OFFER, content_length=len(SDP_OFFER) + 10), 400),
    (request("INVITE", body=SDP_OFFER).replace(b"Content-Length: ", b"Content-Length: x"), 400),
    (request("INVITE").replace(b"CSeq: 1 INVITE", b"CSeq: 1 BYE"), 400),
    (request("INVITE").replace(b"SIP/2.0\r\n", b"SIP/3.0\r\n", 1), 505),
    (b"INVITE\r\n\r\n", 400),
    (b"HELLO WORLD\r\n\r\n", 400),
    (request("OPTIONS").replace(b"Max-Forwards: 70", b"Max-Forwards: many"), 400),
    (request("OPTIONS").replace(b"Max-Forwards: 70", b"Bad Header Line"), 400),
    (request("INVITE", body="x" * (MAX_MESSAGE_BYTES + 1), content_length=None), 513),
    (b"\xff\xfe\r\n\r\n", 400),
])
def test_malformed_requests(raw: bytes, status: int) -> None:
    with pytest.raises(SipParseError) as err:
        parse_sip(raw)
    assert err.value.status == status


def test_a_huge_message_still_yields_headers_to_address_the_refusal() -> None:
    with pytest.raises(SipParseError) as err:
        parse_sip(request("INVITE", body="x" * 20000))
    assert err.value.partial is not None and err.value.partial.call_id == "abc@127.0.0.1"


def test_response_mirrors_the_request() -> None:
    req = parse_sip(request("INVITE", body=SDP_OFFER))
    resp = parse_sip(response_to(req, 180, "Ringing", to_tag="t1").to_bytes())
    assert resp.status == 180 and resp.reason == "Ringing"
    assert resp.header("To").endswith(";tag=t1") and resp.header("Via") == req.header("Via")
    assert resp.cseq == (1, "INVITE") and resp.header("Content-Length") == "0"


tokens = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=10)
values = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
                 max_size=40)


@given(tokens, st.lists(st.tuples(st.sampled_from(["X-A", "X-B", "Subject", "Accept"]), values),
                        max_size=10), st.binary(max_size=300))
def test_serialize_then_parse_round_trips(method: str, extra, body: bytes) -> None:
    headers = [("Via", "SIP/2.0/UDP h:5060;branch=z9hG4bK1"), ("From", "<sip:a@h>;tag=1"),
               ("To", "<sip:b@h>"), ("Call-ID", "c1"), ("CSeq", f"3 {method}"), *extra]
    msg = SipMessage(method=method, uri="sip:b@h", headers=headers, body=body)
    back = parse_sip(msg.to_bytes())
    assert back.method == method and back.body == body
    assert back.headers[:-1] == headers  # the serializer appends Content-Length


@given(st.binary(max_size=3000))
def test_arbitrary_bytes_parse_or_raise_sip_parse_error(data: bytes) -> None:
    try:
        parse_sip(data)
    except SipParseError as err:
        assert err.status in (400, 505, 513)


def test_a_value_folded_onto_an_empty_header_has_no_leading_space() -> None:
    # found by benchmarks/fuzz.py: " 1-24486@h" re-serialized and re-parsed was "1-24486@h",
    # so one dialog could go by two Call-IDs
    raw = (b"BYE sip:bot@h SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nFrom: <sip:a@h>;tag=1"
           b"\r\nTo: <sip:bot@h>;tag=2\r\nCall-ID:\r\n 1-24486@h\r\nCSeq: 2 BYE\r\n\r\n")
    msg = parse_sip(raw)
    assert msg.call_id == "1-24486@h"
    assert parse_sip(msg.to_bytes()).call_id == msg.call_id


@pytest.mark.parametrize(("uri", "user"), [
    ("sip:echo@127.0.0.1:5060", "echo"),
    ("sips:echo@example.com;transport=tls", "echo"),
    ("SIP:echo@host", "echo"),
    ("sip:echo;user=phone@host", "echo"),
    ("sip:echo:secret@host", "echo"),
    ("sip:127.0.0.1:5060", ""),  # no user part
    ("tel:+15551234", ""),  # not a SIP URI
    ("echo", ""),
    ("", ""),
])
def test_the_user_of_a_request_uri(uri: str, user: str) -> None:
    assert uri_user(uri) == user
