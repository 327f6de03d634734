"""The sans-I/O SIP UAS: the INVITE/ACK/BYE dialog, CANCEL before the answer, OPTIONS, 2xx
retransmission until the ACK, and 4xx/5xx answers to what it cannot serve."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sip_requests import SDP_OFFER, request

from transports.sip.message import parse_sip
from transports.sip.uas import (
    CallEnded,
    CallEstablished,
    CallOffered,
    Outgoing,
    UserAgentServer,
)

PEER = ("127.0.0.1", 5061)


def statuses(events) -> list[int]:
    return [parse_sip(e.data).status for e in events if isinstance(e, Outgoing)]


def test_invite_ack_bye() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    ev = uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    assert statuses(ev) == [100, 180]
    offered = [e for e in ev if isinstance(e, CallOffered)]
    assert offered and offered[0].answer.codec == "PCMU" and offered[0].offer.port == 6000
    ok = uas.accept("abc@127.0.0.1", b"v=0\r\n", 0.0)
    resp = parse_sip(ok[0].data)
    assert resp.status == 200 and resp.body == b"v=0\r\n"
    tag = resp.header("To").split("tag=")[1]
    assert parse_sip(ev[1].data).header("To").endswith(tag)  # 180 and 200 share the tag
    assert uas.receive(request("ACK", to_tag=tag), PEER, 0.1) == [CallEstablished("abc@127.0.0.1")]
    bye = uas.receive(request("BYE", cseq=2, to_tag=tag), PEER, 1.0)
    assert statuses(bye) == [200] and CallEnded("abc@127.0.0.1", "bye") in bye
    assert uas.dialogs == {}
    assert statuses(uas.receive(request("BYE", cseq=3, to_tag=tag), PEER, 1.1)) == [481]


def test_invite_retransmission_repeats_the_last_response() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    assert statuses(uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.1)) == [180]
    uas.accept("abc@127.0.0.1", b"", 0.2)
    assert statuses(uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.3)) == [200]


def test_200_is_retransmitted_until_ack_then_given_up() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    uas.accept("abc@127.0.0.1", b"", 0.0)
    times = [t / 10 for t in range(0, 400)]
    sent = [t for t in times if statuses(uas.poll(t)) == [200]]
    assert sent[:3] == [0.5, 1.5, 3.5]  # T1, doubling
    assert "abc@127.0.0.1" not in uas.dialogs  # timer H fired: BYE and the call ended


def _confirmed(uas: UserAgentServer) -> str:
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    tag = parse_sip(uas.accept("abc@127.0.0.1", b"", 0.0)[0].data).header("To").split("tag=")[1]
    uas.receive(request("ACK", to_tag=tag), PEER, 0.1)
    return tag


def _byes(events) -> list[bytes]:
    return [e.data for e in events if isinstance(e, Outgoing) and parse_sip(e.data).method == "BYE"]


def test_our_bye_is_sent_again_until_answered() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    _confirmed(uas)
    (bye,) = _byes(uas.hangup("abc@127.0.0.1", "idle", now=10.0))
    times = [10 + t / 10 for t in range(1, 80)]
    sent = [t for t in times if _byes(uas.poll(t)) == [bye]]  # the same request, byte for byte
    assert sent[:4] == [10.5, 11.5, 13.5, 17.5]  # timer E: T1, doubling, up to T2 (4 s)
    msg = parse_sip(bye)
    answer = (f"SIP/2.0 200 OK\r\nVia: {msg.header('Via')}\r\nFrom: {msg.header('From')}\r\n"
              f"To: {msg.header('To')}\r\nCall-ID: abc@127.0.0.1\r\n"
              f"CSeq: {msg.header('CSeq')}\r\nContent-Length: 0\r\n\r\n").encode()
    assert uas.receive(answer, PEER, 18.0) == []
    assert uas.byes == {} and _byes(uas.poll(30.0)) == []


def test_an_unanswered_bye_is_given_up_after_timer_f() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    _confirmed(uas)
    uas.hangup("abc@127.0.0.1")  # no time given: the first poll starts the timers
    assert _byes(uas.poll(100.0)) == []
    sent = [t for t in (100 + k / 10 for k in range(1, 400)) if _byes(uas.poll(t))]
    assert sent[0] == 100.5 and max(sent) < 132.0  # 64 x T1 after the first poll
    assert uas.byes == {} and uas.byes_unanswered == 1
    assert all(t - s <= 4.0 + 1e-9 for s, t in zip(sent, sent[1:], strict=False))


def test_cancel_before_answer() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    ev = uas.receive(request("CANCEL"), PEER, 0.5)
    assert statuses(ev) == [200, 487] and CallEnded("abc@127.0.0.1", "cancel") in ev
    assert uas.accept("abc@127.0.0.1", b"", 0.6) == []  # too late to answer
    assert statuses(uas.receive(request("CANCEL", call_id="nope"), PEER, 0.7)) == [481]


def test_options_and_unknown_methods() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    ok = uas.receive(request("OPTIONS"), PEER, 0.0)
    assert statuses(ok) == [200] and "INVITE" in parse_sip(ok[0].data).header("Allow")
    assert statuses(uas.receive(request("REGISTER"), PEER, 0.0)) == [501]
    needs_100rel = request("INVITE", body=SDP_OFFER).replace(
        b"Max-Forwards: 70", b"Max-Forwards: 70\r\nRequire: 100rel")
    refused = uas.receive(needs_100rel, PEER, 0.0)
    assert statuses(refused) == [420] and parse_sip(refused[0].data).header("Unsupported") == "100rel"
    assert uas.receive(b"\r\n\r\n", PEER, 0.0) == []  # keep-alive


def test_unanswerable_invites() -> None:
    uas = UserAgentServer("127.0.0.1", 5060, max_calls=1)
    g722 = SDP_OFFER.replace("RTP/AVP 0 8 101", "RTP/AVP 9")
    assert statuses(uas.receive(request("INVITE", body=g722), PEER, 0)) == [488]
    assert statuses(uas.receive(request("INVITE"), PEER, 0)) == [488]  # no offer
    uas.receive(request("INVITE", call_id="one", body=SDP_OFFER), PEER, 0)
    # the call limit is this server's capacity, not a busy callee: 503 with a Retry-After
    full = uas.receive(request("INVITE", call_id="two", body=SDP_OFFER), PEER, 0)
    assert statuses(full) == [503] and parse_sip(full[0].data).header("Retry-After") == "5"


def test_malformed_requests_get_4xx_and_responses_are_dropped() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    bad = uas.receive(request("INVITE", body=SDP_OFFER, drop=("Call-ID",)), PEER, 0)
    assert statuses(bad) == [400]
    assert parse_sip(bad[0].data).reason == "Missing Header: Call-ID"
    huge = uas.receive(request("INVITE", body="x" * 40000), PEER, 0)
    assert statuses(huge) == [513]
    assert uas.receive(b"SIP/2.0 200 OK\r\nbroken\r\n\r\n", PEER, 0) == []
    assert uas.malformed == 3


@settings(max_examples=300)
@given(st.lists(st.sampled_from([
    request("INVITE", body=SDP_OFFER), request("ACK"), request("BYE", cseq=2),
    request("CANCEL"), request("OPTIONS"), request("INVITE", cseq=3, body=SDP_OFFER),
    b"garbage", b"",
]), max_size=12), st.booleans())
def test_any_request_order_never_raises(msgs: list[bytes], accept: bool) -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    for i, m in enumerate(msgs):
        uas.receive(m, PEER, float(i))
        if accept:
            uas.accept("abc@127.0.0.1", b"", float(i))
        uas.poll(float(i) + 0.5)
