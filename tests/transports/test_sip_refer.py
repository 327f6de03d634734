"""Blind transfer over SIP: the REFER the UAS sends inside the dialog, its retransmission, the
NOTIFY sipfrags that follow and their outcome; which targets become which Refer-To URIs; and,
over real UDP sockets, that a refused REFER, a failing sipfrag and a timeout raise
CallControlError and leave the call up, while a transfer that works ends it ("transferred")."""

from __future__ import annotations

import asyncio
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sip_requests import SDP_OFFER, request

from agent.control import CallControlError, NotSupported
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from transports.sip.message import SipMessage, header_tag, parse_sip
from transports.sip.server import SipServer
from transports.sip.transfer import (
    SipfragError,
    TransferError,
    TransferState,
    parse_sipfrag,
    refer_target,
)
from transports.sip.uas import Outgoing, TransferEnded, UserAgentServer

PEER = ("127.0.0.1", 5061)
CID = "abc@127.0.0.1"
CALLER = "sipp <sip:sipp@127.0.0.1:5061>;tag=42"


def answered(uas: UserAgentServer) -> str:
    """A confirmed call from PEER; returns our To tag."""
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    ok = parse_sip(uas.accept(CID, b"v=0\r\n", 0.0)[0].data)
    tag = header_tag(ok.header("To"))
    uas.receive(request("ACK", to_tag=tag), PEER, 0.1)
    return tag


def response(to: SipMessage, status: int, reason: str) -> bytes:
    lines = [f"SIP/2.0 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in to.headers if k in ("Via", "From", "To", "Call-ID", "CSeq")]
    lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def notify(tag: str, cseq: int, frag: str, state: str = "active;expires=60",
           event: str = "refer", ctype: str = "message/sipfrag", call_id: str = CID) -> bytes:
    body = f"{frag}\r\n"
    headers = [
        ("Via", f"SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-n{cseq}"),
        ("From", CALLER), ("To", f"<sip:agent@127.0.0.1:5060>;tag={tag}"),
        ("Call-ID", call_id), ("CSeq", f"{cseq} NOTIFY"), ("Event", event),
        ("Subscription-State", state), ("Content-Type", ctype),
        ("Content-Length", str(len(body))),
    ]
    lines = ["NOTIFY sip:voxline@127.0.0.1:5060 SIP/2.0", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


def sent(events) -> list[SipMessage]:
    return [parse_sip(e.data) for e in events if isinstance(e, Outgoing)]


def outcomes(events) -> list:
    return [e.outcome for e in events if isinstance(e, TransferEnded)]


# --- the REFER ---------------------------------------------------------------------------------
def test_the_refer_is_an_in_dialog_request_with_refer_to_and_referred_by() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    tag = answered(uas)
    (out,) = uas.refer(CID, "sip:human@127.0.0.1:5070", 1.0)
    refer = parse_sip(out.data)
    assert out.addr == PEER
    assert refer.method == "REFER" and refer.uri == "sip:sipp@127.0.0.1:5061"  # their Contact
    assert refer.header("Refer-To") == "<sip:human@127.0.0.1:5070>"
    assert refer.header("Referred-By") == "<sip:agent@127.0.0.1:5060>"  # who the caller called
    assert refer.header("Contact") == "<sip:voxline@127.0.0.1:5060>"
    # From and To swap roles: our tag on From, theirs on To; the dialog's Call-ID
    assert header_tag(refer.header("From")) == tag and header_tag(refer.header("To")) == "42"
    assert refer.call_id == CID and refer.cseq == (2, "REFER")  # past the INVITE's CSeq 1
    assert "branch=z9hG4bK" in refer.header("Via")
    # a later BYE of ours numbers on from the REFER
    (bye,) = sent(uas.hangup(CID, "transferred"))
    assert bye.cseq == (3, "BYE") and 'text="transferred"' in bye.header("Reason")


def test_the_refer_follows_the_record_route_set() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    invite = request("INVITE", body=SDP_OFFER).replace(
        b"Max-Forwards: 70", b"Record-Route: <sip:p1.example;lr>\r\n"
        b"Record-Route: <sip:p2.example;lr>\r\nMax-Forwards: 70")
    uas.receive(invite, PEER, 0.0)
    tag = header_tag(parse_sip(uas.accept(CID, b"", 0.0)[0].data).header("To"))
    uas.receive(request("ACK", to_tag=tag), PEER, 0.1)
    refer = parse_sip(uas.refer(CID, "sip:h@x", 1.0)[0].data)
    assert refer.header_values("Route") == ["<sip:p1.example;lr>", "<sip:p2.example;lr>"]


def test_the_refer_is_retransmitted_on_timer_e_until_answered() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    answered(uas)
    (first,) = uas.refer(CID, "sip:h@127.0.0.1", 10.0)
    times = [10.0 + t / 20 for t in range(1, 200)]
    polled = [(t, [o for o in uas.poll(t) if isinstance(o, Outgoing)]) for t in times]
    again = [t for t, out in polled if out]
    assert all(o.data == first.data for _, out in polled for o in out)  # the same REFER
    # T1 = 0.5 s, doubling, capped at T2 = 4 s
    assert [round(t - 10.0, 2) for t in again] == [0.5, 1.5, 3.5, 7.5]
    # a 100 Trying: the REFER is retransmitted every T2 from then on; a 202 stops it
    refer = parse_sip(first.data)
    uas.receive(response(refer, 100, "Trying"), PEER, 17.6)
    assert uas.dialogs[CID].transfer.state is TransferState.PROCEEDING
    assert [t for t in (19.0, 20.0, 21.0, 21.6) if uas.poll(t)] == [21.6]
    uas.receive(response(refer, 202, "Accepted"), PEER, 22.0)
    assert uas.dialogs[CID].transfer.state is TransferState.ACCEPTED
    assert not any(uas.poll(22.0 + t) for t in range(1, 7))


def test_a_transfer_that_works_202_then_sipfrag_100_then_200() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    tag = answered(uas)
    refer = parse_sip(uas.refer(CID, "sip:human@127.0.0.1:5070", 1.0)[0].data)
    assert uas.receive(response(refer, 202, "Accepted"), PEER, 1.1) == []
    ev = uas.receive(notify(tag, 2, "SIP/2.0 100 Trying"), PEER, 1.2)
    (ok,) = sent(ev)
    assert ok.status == 200 and ok.cseq == (2, "NOTIFY") and not outcomes(ev)
    assert header_tag(ok.header("To")) == tag
    # a retransmitted NOTIFY is answered again, not counted twice
    assert [m.status for m in sent(uas.receive(notify(tag, 2, "SIP/2.0 100 Trying"), PEER, 1.3))] \
        == [200]
    ev = uas.receive(notify(tag, 3, "SIP/2.0 200 OK", "terminated;reason=noresource"), PEER, 1.5)
    assert [m.status for m in sent(ev)] == [200]
    (done,) = outcomes(ev)
    assert done.ok and done.status == 200 and done.detail == \
        "transferred to sip:human@127.0.0.1:5070"
    assert uas.dialogs[CID].transfer.progress == [100, 200]
    assert CID in uas.dialogs  # the call stands until the shell hangs up


def test_a_notify_may_overtake_the_202() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    tag = answered(uas)
    refer = parse_sip(uas.refer(CID, "sip:h@127.0.0.1", 1.0)[0].data)
    (done,) = outcomes(uas.receive(notify(tag, 2, "SIP/2.0 200 OK", "terminated"), PEER, 1.1))
    assert done.ok
    assert uas.receive(response(refer, 202, "Accepted"), PEER, 1.2) == []
    assert not any(uas.poll(1.0 + t) for t in range(1, 40))  # no retransmission, no timeout


@pytest.mark.parametrize("status, reason", [(403, "Forbidden"), (405, "Method Not Allowed"),
                                            (603, "Decline")])
def test_a_refused_refer_fails_and_the_call_stays(status: int, reason: str) -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    answered(uas)
    refer = parse_sip(uas.refer(CID, "sip:h@127.0.0.1", 1.0)[0].data)
    (done,) = outcomes(uas.receive(response(refer, status, reason), PEER, 1.1))
    assert not done.ok and done.status == status and f"{status} {reason}" in done.detail
    assert uas.dialogs[CID].state == "confirmed"
    # another transfer may be tried now
    assert uas.refer(CID, "sip:other@127.0.0.1", 2.0)


def test_a_response_of_another_transaction_is_not_the_refers() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    answered(uas)
    refer = parse_sip(uas.refer(CID, "sip:h@127.0.0.1", 1.0)[0].data)
    forged = response(refer, 403, "Forbidden").replace(b"branch=z9hG4bK", b"branch=z9hG4bKx")
    assert uas.receive(forged, PEER, 1.1) == []
    assert uas.dialogs[CID].transfer.state is TransferState.CALLING


@pytest.mark.parametrize("frag, state, status", [
    ("SIP/2.0 486 Busy Here", "terminated", 486),
    ("SIP/2.0 404 Not Found", "terminated;reason=noresource", 404),
    ("SIP/2.0 180 Ringing", "terminated;reason=timeout", 180),  # ended without a final answer
])
def test_a_failing_sipfrag_fails_the_transfer(frag: str, state: str, status: int) -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    tag = answered(uas)
    refer = parse_sip(uas.refer(CID, "sip:h@127.0.0.1", 1.0)[0].data)
    uas.receive(response(refer, 202, "Accepted"), PEER, 1.1)
    ev = uas.receive(notify(tag, 2, frag, state), PEER, 1.2)
    (done,) = outcomes(ev)
    assert [m.status for m in sent(ev)] == [200]
    assert not done.ok and done.status == status and str(status) in done.detail
    assert uas.dialogs[CID].state == "confirmed"


def test_no_final_notify_in_time_fails_the_transfer() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    tag = answered(uas)
    refer = parse_sip(uas.refer(CID, "sip:h@127.0.0.1", 1.0, timeout_s=30.0)[0].data)
    uas.receive(response(refer, 202, "Accepted"), PEER, 1.1)
    uas.receive(notify(tag, 2, "SIP/2.0 180 Ringing"), PEER, 2.0)
    assert not outcomes(uas.poll(30.9))
    (done,) = outcomes(uas.poll(31.0))
    assert not done.ok and "timed out" in done.detail and "no final NOTIFY" in done.detail
    # a late NOTIFY is answered, and changes nothing
    ev = uas.receive(notify(tag, 3, "SIP/2.0 200 OK", "terminated"), PEER, 32.0)
    assert [m.status for m in sent(ev)] == [200] and not outcomes(ev)
    assert uas.dialogs[CID].state == "confirmed"


def test_an_unanswered_refer_times_out() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    answered(uas)
    uas.refer(CID, "sip:h@127.0.0.1", 0.0, timeout_s=5.0)
    got = [o for t in range(1, 60) for o in outcomes(uas.poll(t / 10))]
    assert len(got) == 1 and "no answer to the REFER" in got[0].detail


def test_notifies_that_are_not_the_transfers() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    tag = answered(uas)
    # no REFER sent: no subscription
    assert [m.status for m in sent(uas.receive(notify(tag, 2, "SIP/2.0 200 OK"), PEER, 1))] == [481]
    uas.refer(CID, "sip:h@127.0.0.1", 1.0)
    cases = [
        (notify(tag, 3, "SIP/2.0 200 OK", event="presence"), 489),
        (notify(tag, 4, "SIP/2.0 200 OK", event="refer;id=99"), 481),
        (notify(tag, 5, "SIP/2.0 200 OK", ctype="text/plain"), 415),
        (notify(tag, 6, "hello there"), 400),
        (notify("wrong", 7, "SIP/2.0 200 OK"), 481),
        (notify(tag, 8, "SIP/2.0 200 OK", call_id="other@x"), 481),
    ]
    for data, status in cases:
        ev = uas.receive(data, PEER, 1.5)
        assert [m.status for m in sent(ev)] == [status] and not outcomes(ev)
    assert uas.dialogs[CID].transfer.state is TransferState.CALLING
    # with the right id it counts
    assert outcomes(uas.receive(notify(tag, 9, "SIP/2.0 200 OK", event="refer;id=2"), PEER, 2))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(
    st.integers(0, 6), st.text(max_size=30),
    st.sampled_from(["refer", "refer;id=2", "refer;id=", "REFER ; id = 2", "", "x;;;"]),
    st.sampled_from(["message/sipfrag", "message/sipfrag;version=2.0", "", "text/plain"]),
    st.sampled_from(["active", "terminated", "pending;expires=1", ""]),
    st.integers(100, 699)), max_size=12))
def test_any_notifies_and_responses_never_raise_and_end_a_transfer_once(steps) -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    tag = answered(uas)
    refer = parse_sip(uas.refer(CID, "sip:h@127.0.0.1", 1.0)[0].data)
    ended = []
    for i, (cseq, frag, event, ctype, state, status) in enumerate(steps):
        if i % 3 == 2:
            ev = uas.receive(response(refer, status, "X"), PEER, 1.0 + i)
        else:
            ev = uas.receive(notify(tag, cseq, frag, state, event, ctype), PEER, 1.0 + i)
            assert len(sent(ev)) == 1  # every NOTIFY is answered
        ended += outcomes(ev)
        ended += outcomes(uas.poll(1.0 + i + 0.5))
    assert len(ended) <= 1


def test_a_transfer_needs_a_confirmed_call_and_one_at_a_time() -> None:
    uas = UserAgentServer("127.0.0.1", 5060)
    with pytest.raises(TransferError, match="ended"):
        uas.refer(CID, "sip:h@x", 0.0)
    uas.receive(request("INVITE", body=SDP_OFFER), PEER, 0.0)
    with pytest.raises(TransferError, match="not set up"):
        uas.refer(CID, "sip:h@x", 0.0)
    tag = header_tag(parse_sip(uas.accept(CID, b"", 0.0)[0].data).header("To"))
    uas.receive(request("ACK", to_tag=tag), PEER, 0.1)
    uas.refer(CID, "sip:h@x", 0.2)
    with pytest.raises(TransferError, match="already under way"):
        uas.refer(CID, "sip:i@x", 0.3)


# --- sipfrag and targets ---------------------------------------------------------------------
def test_sipfrag_status_lines() -> None:
    assert parse_sipfrag(b"SIP/2.0 200 OK\r\n") == (200, "OK")
    assert parse_sipfrag(b"SIP/2.0 100 Trying") == (100, "Trying")
    assert parse_sipfrag(b"SIP/2.0 486 Busy Here\r\nContent-Length: 0\r\n\r\n") == (486, "Busy Here")
    assert parse_sipfrag(b"SIP/2.0 503\r\n") == (503, "")
    for bad in (b"", b"INVITE sip:x SIP/2.0", b"SIP/2.0 2000 OK", b"SIP/2.0 099 x",
                b"SIP/1.0 200 OK", b"SIP/2.0 \xd9\xa200 OK", b"\xff\xfe"):
        with pytest.raises(SipfragError):
            parse_sipfrag(bad)


@pytest.mark.parametrize("target, uri", [
    ("sip:human@127.0.0.1:5070", "sip:human@127.0.0.1:5070"),
    ("SIP:Desk@pbx.example;transport=udp", "sip:Desk@pbx.example;transport=udp"),
    ("sips:desk@pbx.example", "sips:desk@pbx.example"),
    ("tel:+15551234567", "tel:+15551234567"),
    ("desk@pbx.example", "sip:desk@pbx.example"),
    ("+1 (555) 123-4567", "sip:+15551234567@127.0.0.1:5061"),  # at the caller's host
    ("1002", "sip:1002@127.0.0.1:5061"),
    ("frontdesk", "sip:frontdesk@127.0.0.1:5061"),
])
def test_targets_become_refer_to_uris(target: str, uri: str) -> None:
    assert refer_target(target, CALLER) == uri


def test_a_bare_target_uses_the_from_host_else_the_signalling_address() -> None:
    assert refer_target("200", '"A" <sip:100@pbx.example>;tag=1') == "sip:200@pbx.example"
    assert refer_target("200", "<tel:+1555>;tag=1", "192.0.2.7:5060") == "sip:200@192.0.2.7:5060"
    with pytest.raises(TransferError):
        refer_target("200", "<tel:+1555>;tag=1")


@pytest.mark.parametrize("target", [
    "", "   ", "sip:", "sip:@host", "sip:a@b\r\nRoute: <sip:evil>", "sip:a@b>;x=<y",
    "sip:a@b?Replaces=abc%40x", "sip:a@b, <sip:c@d>", 'sip:"a"@b', "sip:a b@c",
    "human\nBYE", "a<b", "@@", "http://example.com", "sip:" + "a" * 300,
])
def test_targets_that_could_forge_headers_are_refused(target: str) -> None:
    with pytest.raises(TransferError):
        refer_target(target, CALLER)


@given(st.text(max_size=80))
def test_any_accepted_target_is_one_safe_header_value(target: str) -> None:
    try:
        uri = refer_target(target, CALLER)
    except TransferError:
        return
    assert not any(c in uri for c in '\r\n<>",? \t') and uri.split(":", 1)[0] in (
        "sip", "sips", "tel")


# --- over UDP: the server and session.control ------------------------------------------------
class Idle(Stage):
    name = "idle"

    def process(self, frame, direction) -> None:
        self.push(frame, direction)


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s


async def recv_sip(sock: socket.socket, method: str = "", status: int = 0,
                   wait: float = 5.0) -> SipMessage:
    loop = asyncio.get_running_loop()
    while True:
        msg = parse_sip(await asyncio.wait_for(loop.sock_recv(sock, 65535), wait))
        if (method and msg.method == method) or (status and msg.status == status):
            return msg


class Caller:
    """A SIP caller on a UDP socket: calls the server, then plays the transferee's part."""

    def __init__(self, server: SipServer, sock: socket.socket, rtp: socket.socket,
                 telephone_event: bool = True) -> None:
        self.server, self.sock, self.rtp = server, sock, rtp
        self.addr = (server.host, server.port)
        self.telephone_event = telephone_event
        self.tag = ""
        self.cseq = 1

    async def call(self) -> Session:
        offer = SDP_OFFER.replace("m=audio 6000", f"m=audio {self.rtp.getsockname()[1]}")
        if not self.telephone_event:
            offer = offer.replace(" 101\r\n", "\r\n").replace(
                "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-11,16\r\n", "")
        self.sock.sendto(request("INVITE", body=offer).replace(
            b"127.0.0.1:5061", f"127.0.0.1:{self.sock.getsockname()[1]}".encode()), self.addr)
        ok = await recv_sip(self.sock, status=200)
        self.tag = header_tag(ok.header("To"))
        self.send(request("ACK", to_tag=self.tag))
        for _ in range(100):
            call = self.server.calls.get(CID)
            if call is not None and call.session.control is not None:
                return call.session
            await asyncio.sleep(0.02)
        raise AssertionError("the call was never established")

    def send(self, data: bytes) -> None:
        port = self.sock.getsockname()[1]
        self.sock.sendto(data.replace(b"127.0.0.1:5061", f"127.0.0.1:{port}".encode()),
                         self.addr)

    def notify(self, frag: str, state: str = "active") -> None:
        self.cseq += 1
        self.send(notify(self.tag, self.cseq, frag, state))


async def with_call(body, **options) -> None:
    server = SipServer(lambda: Session(Pipeline([Idle()])), port=0, rtp_ports=(43000, 43100),
                       **options)
    await server.start()
    sock, rtp = udp(), udp()
    try:
        await body(server, Caller(server, sock, rtp))
    finally:
        await server.stop()
        sock.close()
        rtp.close()


def test_a_transfer_that_works_ends_the_call_as_transferred() -> None:
    async def body(server: SipServer, caller: Caller) -> None:
        session = await caller.call()
        assert session.control.transport == "sip"
        task = asyncio.ensure_future(session.control.transfer("sip:human@127.0.0.1:5070"))
        refer = await recv_sip(caller.sock, "REFER")
        assert refer.header("Refer-To") == "<sip:human@127.0.0.1:5070>"
        caller.sock.sendto(response(refer, 202, "Accepted"), caller.addr)
        caller.notify("SIP/2.0 100 Trying")
        assert (await recv_sip(caller.sock, status=200)).cseq[1] == "NOTIFY"
        assert not task.done()
        caller.notify("SIP/2.0 200 OK", "terminated;reason=noresource")
        assert await asyncio.wait_for(task, 5) == "transferred to sip:human@127.0.0.1:5070"
        bye = await recv_sip(caller.sock, "BYE")
        assert 'text="transferred"' in bye.header("Reason") and bye.cseq == (3, "BYE")
        for _ in range(100):
            if server.reports:
                break
            await asyncio.sleep(0.02)
        assert server.reports[0].reason == "transferred" and session.closed
        assert CID not in server.calls and CID not in server.uas.dialogs

    asyncio.run(with_call(body))


def test_failed_transfers_raise_and_leave_the_call_up() -> None:
    async def body(server: SipServer, caller: Caller) -> None:
        session = await caller.call()
        control = session.control
        # 1. the REFER is refused
        task = asyncio.ensure_future(control.transfer("sip:human@127.0.0.1:5070"))
        refer = await recv_sip(caller.sock, "REFER")
        caller.sock.sendto(response(refer, 403, "Forbidden"), caller.addr)
        with pytest.raises(CallControlError, match="403 Forbidden"):
            await asyncio.wait_for(task, 5)
        # 2. the target is busy (a bare number: at the caller's host)
        task = asyncio.ensure_future(control.transfer("1002"))
        refer = await recv_sip(caller.sock, "REFER")
        port = caller.sock.getsockname()[1]
        assert refer.header("Refer-To") == f"<sip:1002@127.0.0.1:{port}>"
        caller.sock.sendto(response(refer, 202, "Accepted"), caller.addr)
        caller.notify("SIP/2.0 486 Busy Here", "terminated")
        with pytest.raises(CallControlError, match="486 Busy Here"):
            await asyncio.wait_for(task, 5)
        # 3. accepted, then nothing: the configured timeout
        task = asyncio.ensure_future(control.transfer(""))  # the default target
        refer = await recv_sip(caller.sock, "REFER")
        assert refer.header("Refer-To") == "<sip:desk@127.0.0.1:5099>"
        caller.sock.sendto(response(refer, 202, "Accepted"), caller.addr)
        with pytest.raises(CallControlError, match="timed out"):
            await asyncio.wait_for(task, 5)
        # 4. a target that could forge a header is refused before anything is sent
        with pytest.raises(CallControlError, match="characters"):
            await control.transfer("sip:a@b?Replaces=x")
        # the call is still up: no BYE came, the session is open, the dialog stands
        assert CID in server.calls and not session.closed and not server.reports
        with pytest.raises(TimeoutError):
            await recv_sip(caller.sock, "BYE", wait=0.3)
        caller.send(request("BYE", cseq=5, to_tag=caller.tag))
        await recv_sip(caller.sock, status=200)

    asyncio.run(with_call(body, transfer_to="sip:desk@127.0.0.1:5099", transfer_timeout_s=0.6))


def test_a_caller_hanging_up_during_a_transfer_fails_it() -> None:
    async def body(server: SipServer, caller: Caller) -> None:
        session = await caller.call()
        task = asyncio.ensure_future(session.control.transfer("sip:h@127.0.0.1"))
        await recv_sip(caller.sock, "REFER")
        caller.send(request("BYE", cseq=2, to_tag=caller.tag))
        with pytest.raises(CallControlError, match="ended"):
            await asyncio.wait_for(task, 5)

    asyncio.run(with_call(body))


def test_send_dtmf_through_the_control() -> None:
    async def body(server: SipServer, caller: Caller) -> None:
        session = await caller.call()
        with pytest.raises(CallControlError):
            await session.control.send_dtmf("12x")
        await asyncio.wait_for(session.control.send_dtmf("4*", duration_ms=60, gap_ms=40), 5)
        assert server.calls[CID].media.stats.dtmf_sent == "4*"

    asyncio.run(with_call(body))


def test_no_telephone_event_in_the_offer_means_no_digits() -> None:
    async def body(server: SipServer, caller: Caller) -> None:
        caller.telephone_event = False
        session = await caller.call()
        with pytest.raises(NotSupported, match="telephone-event"):
            await session.control.send_dtmf("1")

    asyncio.run(with_call(body))
