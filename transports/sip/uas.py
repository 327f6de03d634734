"""The SIP user agent server, sans-I/O: feed it datagrams, get back datagrams to send and call
events. It keeps one dialog per Call-ID (INVITE → 100/180, 200 with the SDP answer once the
shell ``accept``s, retransmitted until the ACK; BYE, CANCEL, OPTIONS) and answers malformed
requests with the proper 4xx/5xx. It never raises on input.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from transports.sip.message import SipMessage, SipParseError, parse_sip, response_to
from transports.sip.sdp import MediaAnswer, MediaOffer, SdpError, choose, parse_offer

Address = tuple[str, int]
T1_S = 0.5  # RFC 3261 timer T1: first 2xx retransmission interval
T2_S = 4.0  # cap of the doubling interval
ACK_TIMEOUT_S = 64 * T1_S  # timer H: give up on a missing ACK
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS"


@dataclass(slots=True, frozen=True)
class Outgoing:
    data: bytes
    addr: Address


@dataclass(slots=True, frozen=True)
class CallOffered:
    call_id: str
    offer: MediaOffer
    answer: MediaAnswer
    caller: str  # the From header
    callee: str  # the Request-URI


@dataclass(slots=True, frozen=True)
class CallEstablished:
    call_id: str


@dataclass(slots=True, frozen=True)
class CallEnded:
    call_id: str
    reason: str  # "bye" | "cancel" | "no-ack" | "hangup"


Event = Outgoing | CallOffered | CallEstablished | CallEnded


@dataclass(slots=True)
class Dialog:
    invite: SipMessage
    addr: Address
    to_tag: str
    state: str = "offered"  # offered → answered → confirmed; or rejected
    final: bytes = b""  # the final response to the INVITE, for retransmissions
    provisional: bytes = b""
    answer_body: bytes = b""
    retransmit_at: float = 0.0
    interval: float = T1_S
    answered_at: float = 0.0


class UserAgentServer:
    """``receive(data, addr, now)`` → events; ``accept``/``reject``/``hangup`` → datagrams."""

    def __init__(self, host: str, port: int, max_calls: int = 100,
                 user_agent: str = "voxline") -> None:
        self.host, self.port = host, port
        self.max_calls = max_calls
        self.user_agent = user_agent
        self.dialogs: dict[str, Dialog] = {}
        self.rejected: dict[int, int] = {}  # status code -> count
        self.malformed = 0

    # --- helpers -----------------------------------------------------------------------------
    @property
    def contact(self) -> str:
        return f"<sip:voxline@{self.host}:{self.port}>"

    def _reply(self, req: SipMessage, status: int, reason: str, to_tag: str = "",
               extra: list[tuple[str, str]] | None = None, body: bytes = b"") -> SipMessage:
        headers = [("Server", self.user_agent), *(extra or [])]
        return response_to(req, status, reason, to_tag, headers, body)

    # --- input -------------------------------------------------------------------------------
    def receive(self, data: bytes, addr: Address, now: float = 0.0) -> list[Event]:
        if not data.strip():
            return []  # CRLF keep-alive
        try:
            msg = parse_sip(data)
        except SipParseError as err:
            return self._bad(data, err, addr)
        if not msg.is_request:
            return []  # responses to our BYE; nothing to do
        required = msg.header("Require")
        if required and msg.method not in ("ACK", "CANCEL"):
            # we implement no SIP extension (100rel, timer, ...): RFC 3261 §8.2.2.3
            resp = self._reply(msg, 420, "Bad Extension", extra=[("Unsupported", required)])
            self.rejected[420] = self.rejected.get(420, 0) + 1
            return [Outgoing(resp.to_bytes(), addr)]
        handler = {
            "INVITE": self._invite, "ACK": self._ack, "BYE": self._bye,
            "CANCEL": self._cancel, "OPTIONS": self._options,
        }.get(msg.method)
        if handler is None:
            resp = self._reply(msg, 501, "Not Implemented", extra=[("Allow", ALLOW)])
            return [Outgoing(resp.to_bytes(), addr)]
        return handler(msg, addr, now)

    def _bad(self, data: bytes, err: SipParseError, addr: Address) -> list[Event]:
        self.malformed += 1
        self.rejected[err.status] = self.rejected.get(err.status, 0) + 1
        if data.lstrip(b"\r\n").startswith(b"SIP/"):
            return []  # a malformed response is dropped, never answered
        if data.lstrip(b"\r\n").startswith(b"ACK "):
            return []  # ACK never gets a response
        req = err.partial or SipMessage()
        return [Outgoing(self._reply(req, err.status, err.reason).to_bytes(), addr)]

    def _invite(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        cid = req.call_id
        dlg = self.dialogs.get(cid)
        if dlg is not None:
            if req.cseq[0] == dlg.invite.cseq[0]:  # a retransmission: repeat our last answer
                last = dlg.final or dlg.provisional
                return [Outgoing(last, addr)] if last else []
            if dlg.state == "confirmed":  # re-INVITE (session refresh, hold): same media
                resp = self._reply(req, 200, "OK", dlg.to_tag, [
                    ("Contact", self.contact), ("Content-Type", "application/sdp"),
                ], dlg.answer_body)
                return [Outgoing(resp.to_bytes(), addr)]
            resp = self._reply(req, 491, "Request Pending", dlg.to_tag)
            return [Outgoing(resp.to_bytes(), addr)]
        if len(self.dialogs) >= self.max_calls:
            return self._refuse(req, addr, 486, "Busy Here")
        if req.header("Content-Type").split(";")[0].strip().lower() != "application/sdp":
            # no offer in the INVITE (offer in the ACK) is legal SIP but not supported yet
            return self._refuse(req, addr, 488, "Not Acceptable Here (an SDP offer is required)")
        try:
            offer = parse_offer(req.body)
            answer = choose(offer)
        except SdpError as err:
            return self._refuse(req, addr, 488, "Not Acceptable Here", warning=str(err))
        dlg = Dialog(req, addr, secrets.token_hex(6))
        self.dialogs[cid] = dlg
        trying = self._reply(req, 100, "Trying").to_bytes()
        ringing = self._reply(req, 180, "Ringing", dlg.to_tag, [("Contact", self.contact)])
        dlg.provisional = ringing.to_bytes()
        return [
            Outgoing(trying, addr),
            Outgoing(dlg.provisional, addr),
            CallOffered(cid, offer, answer, req.header("From"), req.uri),
        ]

    def _refuse(self, req: SipMessage, addr: Address, status: int, reason: str,
                warning: str = "") -> list[Event]:
        self.rejected[status] = self.rejected.get(status, 0) + 1
        extra = [("Warning", f'399 voxline "{warning}"')] if warning else []
        resp = self._reply(req, status, reason, secrets.token_hex(6), extra)
        return [Outgoing(resp.to_bytes(), addr)]

    def _ack(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        dlg = self.dialogs.get(req.call_id)
        if dlg is None or dlg.state != "answered":
            return []  # ACK of a non-2xx answer, or a repeat: absorbed
        dlg.state = "confirmed"
        dlg.retransmit_at = 0.0
        return [CallEstablished(req.call_id)]

    def _bye(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        dlg = self.dialogs.pop(req.call_id, None)
        if dlg is None:
            resp = self._reply(req, 481, "Call/Transaction Does Not Exist")
            return [Outgoing(resp.to_bytes(), addr)]
        resp = self._reply(req, 200, "OK", dlg.to_tag)
        return [Outgoing(resp.to_bytes(), addr), CallEnded(req.call_id, "bye")]

    def _cancel(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        dlg = self.dialogs.get(req.call_id)
        if dlg is None or dlg.invite.cseq[0] != req.cseq[0]:
            resp = self._reply(req, 481, "Call/Transaction Does Not Exist")
            return [Outgoing(resp.to_bytes(), addr)]
        out: list[Event] = [Outgoing(self._reply(req, 200, "OK", dlg.to_tag).to_bytes(), addr)]
        if dlg.state == "offered":  # not answered yet: the INVITE ends with 487
            terminated = self._reply(dlg.invite, 487, "Request Terminated", dlg.to_tag)
            dlg.final = terminated.to_bytes()
            dlg.state = "rejected"
            del self.dialogs[req.call_id]
            out += [Outgoing(dlg.final, dlg.addr), CallEnded(req.call_id, "cancel")]
        return out

    def _options(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        resp = self._reply(req, 200, "OK", secrets.token_hex(6), [
            ("Allow", ALLOW), ("Accept", "application/sdp"), ("Contact", self.contact),
        ])
        return [Outgoing(resp.to_bytes(), addr)]

    # --- decisions from the shell ------------------------------------------------------------
    def accept(self, call_id: str, sdp_answer: bytes, now: float) -> list[Outgoing]:
        """Answer an offered call with 200 OK; retransmitted by ``poll`` until the ACK."""
        dlg = self.dialogs.get(call_id)
        if dlg is None or dlg.state != "offered":
            return []  # cancelled meanwhile
        resp = self._reply(dlg.invite, 200, "OK", dlg.to_tag, [
            ("Contact", self.contact), ("Allow", ALLOW), ("Content-Type", "application/sdp"),
        ], sdp_answer)
        dlg.final = resp.to_bytes()
        dlg.answer_body = sdp_answer
        dlg.state = "answered"
        dlg.answered_at = now
        dlg.interval = T1_S
        dlg.retransmit_at = now + T1_S
        return [Outgoing(dlg.final, dlg.addr)]

    def reject(self, call_id: str, status: int, reason: str) -> list[Outgoing]:
        dlg = self.dialogs.pop(call_id, None)
        if dlg is None or dlg.state != "offered":
            return []
        self.rejected[status] = self.rejected.get(status, 0) + 1
        return [Outgoing(self._reply(dlg.invite, status, reason, dlg.to_tag).to_bytes(), dlg.addr)]

    def hangup(self, call_id: str, reason: str = "") -> list[Outgoing]:
        """We end the call: a BYE inside the dialog (From and To swap roles). A ``reason``
        (``idle``) goes in an RFC 3326 ``Reason`` header as normal call clearing (Q.850
        cause 16) with the reason as its text."""
        dlg = self.dialogs.pop(call_id, None)
        if dlg is None or dlg.state not in ("answered", "confirmed"):
            return []
        inv = dlg.invite
        target = inv.header("Contact").strip("<>").split(">")[0] or inv.header("From")
        if "<" in target:
            target = target.split("<", 1)[1].split(">", 1)[0]
        to = inv.header("To")
        if ";tag=" not in to.lower():
            to = f"{to};tag={dlg.to_tag}"
        headers = [
            ("Via", f"SIP/2.0/UDP {self.host}:{self.port};branch=z9hG4bK{secrets.token_hex(8)}"),
            ("Max-Forwards", "70"), ("From", to), ("To", inv.header("From")),
            ("Call-ID", inv.call_id), ("CSeq", f"{inv.cseq[0] + 1} BYE"),
            ("User-Agent", self.user_agent),
        ]
        if reason:
            text = "".join(c for c in reason if c.isprintable() and c not in '"\\')[:64]
            headers.append(("Reason", f'Q.850;cause=16;text="{text}"'))
        bye = SipMessage(method="BYE", uri=target.strip(), headers=headers)
        return [Outgoing(bye.to_bytes(), dlg.addr)]

    def poll(self, now: float) -> list[Event]:
        """Timers: retransmit unacknowledged 200 OKs (doubling up to T2) and give up after 32 s."""
        out: list[Event] = []
        for cid, dlg in list(self.dialogs.items()):
            if dlg.state != "answered" or not dlg.retransmit_at or now < dlg.retransmit_at:
                continue
            if now - dlg.answered_at >= ACK_TIMEOUT_S:
                out += self.hangup(cid)
                out.append(CallEnded(cid, "no-ack"))
                continue
            out.append(Outgoing(dlg.final, dlg.addr))
            dlg.interval = min(dlg.interval * 2, T2_S)
            dlg.retransmit_at = now + dlg.interval
        return out
