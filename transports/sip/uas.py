"""The SIP user agent server, sans-I/O: feed it datagrams, get back datagrams to send and call
events. It keeps one dialog per Call-ID (INVITE → 100/180, 200 with the SDP answer once the
shell ``accept``s, retransmitted until the ACK; BYE, CANCEL, OPTIONS) and answers malformed
requests with the proper 4xx/5xx. It never raises on input.

What it admits: a request inside a dialog must match it by Call-ID, the caller's From tag and
our To tag (RFC 3261 §12.2.2), else 481. A new INVITE is refused, before anything is
allocated for it, with 503 and a Retry-After when the server is shutting down, when its source
is over its INVITE rate or already has ``burst`` calls not yet ACKed, or when the call limit
is reached (503, not 486 Busy Here: the limit is this server's capacity, not a callee on
another call, and 503 lets a proxy or trunk fail over to another server); with 488 when the
offer's media address is one we will not send to (see :meth:`UserAgentServer.media_refusal`).

A confirmed call can be transferred (:meth:`UserAgentServer.refer`): a REFER inside the dialog,
its answer and the NOTIFYs that follow are run by :class:`~transports.sip.transfer.Transfer`,
and the outcome comes out as a :class:`TransferEnded` event.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from transports.ratelimit import InviteRateLimit, source_key
from transports.sip.message import (
    SipMessage,
    SipParseError,
    header_tag,
    parse_sip,
    response_to,
)
from transports.sip.sdp import MediaAnswer, MediaOffer, SdpError, choose, parse_offer
from transports.sip.transfer import (
    TRANSFER_TIMEOUT_S,
    Transfer,
    TransferError,
    TransferOutcome,
    name_addr_uri,
    refer_target,
)

Address = tuple[str, int]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
T1_S = 0.5  # RFC 3261 timer T1: first 2xx retransmission interval
T2_S = 4.0  # cap of the doubling interval
ACK_TIMEOUT_S = 64 * T1_S  # timer H: give up on a missing ACK
BYE_TIMEOUT_S = 64 * T1_S  # timer F: give up on an unanswered BYE of ours
MAX_PENDING_BYES = 4096  # unanswered BYEs kept for retransmission (the oldest go first)
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY"
BUSY_RETRY_AFTER_S = 5  # a full server: calls end within minutes, a retry soon may fit
SHUTDOWN_RETRY_AFTER_S = 30  # a server going down: a restart takes longer


@dataclass(slots=True, frozen=True)
class Outgoing:
    data: bytes
    addr: Address


@dataclass(slots=True)
class _PendingBye:
    """A BYE of ours not answered yet: over UDP it is sent again until a response comes or
    timer F runs out (RFC 3261 §17.1.2.2: T1, doubling up to T2; T2 once provisional)."""

    data: bytes
    addr: Address
    cseq: int
    give_up_at: float  # 0: set at the first poll (hung up without a time)
    next_at: float = 0.0
    interval: float = T1_S


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
class MediaChanged:
    """A re-INVITE moved the caller's media (a transfer, another media server): RTP now comes
    from and goes to ``offer``'s address and port."""

    call_id: str
    offer: MediaOffer


@dataclass(slots=True, frozen=True)
class CallEnded:
    call_id: str
    reason: str  # "bye" | "cancel" | "no-ack" | "hangup"


@dataclass(slots=True, frozen=True)
class TransferEnded:
    """The outcome of :meth:`UserAgentServer.refer`: the call still stands either way (on
    success the shell hangs up: the caller is talking to the target now)."""

    call_id: str
    outcome: TransferOutcome


Event = Outgoing | CallOffered | CallEstablished | MediaChanged | CallEnded | TransferEnded


@dataclass(slots=True)
class Dialog:
    invite: SipMessage
    addr: Address
    to_tag: str
    from_tag: str = ""  # the caller's tag, the other half of the dialog's identity
    source: str = ""  # the caller's rate-limit key (its IP; an IPv6 /64)
    media: Address = ("", 0)  # where the caller's RTP comes from and goes, per its last offer
    state: str = "offered"  # offered → answered → confirmed; or rejected
    final: bytes = b""  # the final response to the INVITE, for retransmissions
    provisional: bytes = b""
    answer_body: bytes = b""
    retransmit_at: float = 0.0
    interval: float = T1_S
    answered_at: float = 0.0
    local_cseq: int = 0  # the CSeq of our last request in the dialog (starts at the INVITE's)
    transfer: Transfer | None = None  # the dialog's last REFER


class UserAgentServer:
    """``receive(data, addr, now)`` → events; ``accept``/``reject``/``hangup`` → datagrams.

    ``media_peers``: networks (``"10.1.2.0/24"``) whose addresses an offer's ``c=`` may name
    besides the INVITE's own source address. ``invite_rate``: the per-source limit on new
    INVITEs (None: no limit). ``max_calls_per_source``: calls one source may hold at once (0:
    no limit besides ``max_calls``; a trunk or a PBX brings every call from one address).
    ``ack_timeout_s``: how long an answered call waits for its ACK before it is ended
    (RFC 3261 timer H)."""

    def __init__(self, host: str, port: int, max_calls: int = 100,
                 user_agent: str = "voxline",
                 media_peers: Iterable[str | Network] = (),
                 invite_rate: InviteRateLimit | None = None,
                 max_calls_per_source: int = 0,
                 ack_timeout_s: float = ACK_TIMEOUT_S) -> None:
        self.host, self.port = host, port
        self.max_calls = max_calls
        self.user_agent = user_agent
        self.media_peers: tuple[Network, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in media_peers)
        self.invite_rate = invite_rate or InviteRateLimit(rate=0)
        self.max_calls_per_source = max_calls_per_source
        self.ack_timeout_s = ack_timeout_s
        self.draining = False  # shutting down: new INVITEs get 503
        self.dialogs: dict[str, Dialog] = {}
        self.byes: dict[str, _PendingBye] = {}  # Call-ID -> our BYE, until it is answered
        self.byes_unanswered = 0  # BYEs of ours that timer F gave up on
        self.rejected: dict[int, int] = {}  # status code -> count
        self.mismatched = 0  # in-dialog requests whose tags did not match the dialog's
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
            return self._response(msg, now)
        required = msg.header("Require")
        if required and msg.method not in ("ACK", "CANCEL"):
            # we implement no SIP extension (100rel, timer, ...): RFC 3261 §8.2.2.3
            resp = self._reply(msg, 420, "Bad Extension", extra=[("Unsupported", required)])
            self.rejected[420] = self.rejected.get(420, 0) + 1
            return [Outgoing(resp.to_bytes(), addr)]
        handler = {
            "INVITE": self._invite, "ACK": self._ack, "BYE": self._bye,
            "CANCEL": self._cancel, "OPTIONS": self._options, "NOTIFY": self._notify,
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

    def _matches(self, dlg: Dialog, req: SipMessage) -> bool:
        """A request inside ``dlg``: the caller's From tag and our To tag (§12.2.2)."""
        ok = (header_tag(req.header("From")) == dlg.from_tag
              and header_tag(req.header("To")) == dlg.to_tag)
        if not ok:
            self.mismatched += 1
        return ok

    def _no_dialog(self, req: SipMessage, addr: Address) -> list[Event]:
        self.rejected[481] = self.rejected.get(481, 0) + 1
        resp = self._reply(req, 481, "Call/Transaction Does Not Exist")
        return [Outgoing(resp.to_bytes(), addr)]

    def _invite(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        cid = req.call_id
        dlg = self.dialogs.get(cid)
        if dlg is not None:
            if not header_tag(req.header("To")):  # not in the dialog: the INVITE that made it?
                if header_tag(req.header("From")) != dlg.from_tag:
                    # the same Call-ID from another caller: a merged request (§8.2.2.2)
                    return self._refuse(req, addr, 482, "Loop Detected")
                if req.cseq[0] == dlg.invite.cseq[0]:  # a retransmission: repeat our answer
                    last = dlg.final or dlg.provisional
                    return [Outgoing(last, addr)] if last else []
                return self._refuse(req, addr, 482, "Loop Detected")
            if not self._matches(dlg, req):
                return self._no_dialog(req, addr)
            if req.cseq[0] == dlg.invite.cseq[0]:
                last = dlg.final or dlg.provisional
                return [Outgoing(last, addr)] if last else []
            if dlg.state == "confirmed":  # re-INVITE (session refresh, hold): our same answer
                resp = self._reply(req, 200, "OK", dlg.to_tag, [
                    ("Contact", self.contact), ("Content-Type", "application/sdp"),
                ], dlg.answer_body)
                return [Outgoing(resp.to_bytes(), addr), *self._moved(dlg, req, addr)]
            resp = self._reply(req, 491, "Request Pending", dlg.to_tag)
            return [Outgoing(resp.to_bytes(), addr)]
        if header_tag(req.header("To")):  # a re-INVITE of a dialog we do not have
            return self._no_dialog(req, addr)
        if self.draining:
            return self._refuse(req, addr, 503, "Service Unavailable (shutting down)",
                                retry_after=SHUTDOWN_RETRY_AFTER_S)
        wait = self.invite_rate.allow(addr[0], now)
        if wait:
            return self._refuse(req, addr, 503, "Service Unavailable (too many calls from "
                                "this address)", retry_after=InviteRateLimit.retry_after(wait))
        source = source_key(addr[0])
        if self.invite_rate.enabled or self.max_calls_per_source:
            mine = [d for d in self.dialogs.values() if d.source == source]
            pending = sum(d.state != "confirmed" for d in mine)
            if self.invite_rate.enabled and pending >= self.invite_rate.burst:
                return self._refuse(req, addr, 503, "Service Unavailable (too many calls "
                                    "being set up from this address)",
                                    retry_after=BUSY_RETRY_AFTER_S)
            if self.max_calls_per_source and len(mine) >= self.max_calls_per_source:
                return self._refuse(req, addr, 503, "Service Unavailable (too many calls "
                                    "from this address)", retry_after=BUSY_RETRY_AFTER_S)
        if len(self.dialogs) >= self.max_calls:
            return self._refuse(req, addr, 503, "Service Unavailable (call limit reached)",
                                retry_after=BUSY_RETRY_AFTER_S)
        if req.header("Content-Type").split(";")[0].strip().lower() != "application/sdp":
            # no offer in the INVITE (offer in the ACK) is legal SIP but not supported yet
            return self._refuse(req, addr, 488, "Not Acceptable Here (an SDP offer is required)")
        try:
            offer = parse_offer(req.body)
            answer = choose(offer)
        except SdpError as err:
            return self._refuse(req, addr, 488, "Not Acceptable Here", warning=str(err))
        refusal = self.media_refusal(offer.address, addr)
        if refusal:
            return self._refuse(req, addr, 488, "Not Acceptable Here", warning=refusal)
        dlg = Dialog(req, addr, secrets.token_hex(6), header_tag(req.header("From")), source,
                     (offer.address, offer.port), local_cseq=req.cseq[0])
        self.dialogs[cid] = dlg
        trying = self._reply(req, 100, "Trying").to_bytes()
        ringing = self._reply(req, 180, "Ringing", dlg.to_tag, [("Contact", self.contact)])
        dlg.provisional = ringing.to_bytes()
        return [
            Outgoing(trying, addr),
            Outgoing(dlg.provisional, addr),
            CallOffered(cid, offer, answer, req.header("From"), req.uri),
        ]

    def _moved(self, dlg: Dialog, req: SipMessage, addr: Address) -> list[Event]:
        """A re-INVITE's offer naming new media we may use (else the media stays as it was:
        a hold with ``c=0.0.0.0``, a refresh without a body, an address we refuse)."""
        try:
            offer = parse_offer(req.body)
        except SdpError:
            return []
        media = (offer.address, offer.port)
        if media == dlg.media or self.media_refusal(offer.address, addr):
            return []
        dlg.media = media
        return [MediaChanged(req.call_id, offer)]

    def media_refusal(self, address: str, signalling: Address) -> str:
        """Why we will not send RTP to ``address`` (an offer's numeric ``c=``) for a call
        signalled from ``signalling``; ``""`` when we will. We send only to the host the
        INVITE came from, or into ``media_peers`` (a PBX or trunk with separate media
        servers): otherwise ~700 bytes of signalling would aim a call's RTP at a third
        party. The address must also suit our media socket, which is bound to ``host``: an
        IPv4 socket cannot reach an IPv6 address (an IPv6 one reaches IPv4 ones mapped)."""
        ip = ipaddress.ip_address(address)
        try:
            ours = ipaddress.ip_address(self.host.split("%", 1)[0]).version
        except ValueError:  # not bound yet: the shell sets the numeric host at start
            ours = ip.version
        if ours == 4 and ip.version == 6:
            return f"connection address {address} is IPv6; this server's media is IPv4"
        try:
            peer = ipaddress.ip_address(signalling[0].split("%", 1)[0])
        except ValueError:
            peer = None
        if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
            peer = peer.ipv4_mapped
        if ip == peer or any(ip in net for net in self.media_peers):
            return ""
        return (f"connection address {address} is not the address this INVITE came from; "
                "media from other hosts is not accepted here")

    def _refuse(self, req: SipMessage, addr: Address, status: int, reason: str,
                warning: str = "", retry_after: int = 0) -> list[Event]:
        self.rejected[status] = self.rejected.get(status, 0) + 1
        extra = [("Warning", f'399 voxline "{_quotable(warning)}"')] if warning else []
        if retry_after:
            extra.append(("Retry-After", str(retry_after)))
        resp = self._reply(req, status, reason, secrets.token_hex(6), extra)
        return [Outgoing(resp.to_bytes(), addr)]

    def _ack(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        dlg = self.dialogs.get(req.call_id)
        if dlg is None or dlg.state != "answered":
            return []  # ACK of a non-2xx answer, or a repeat: absorbed
        if not self._matches(dlg, req):
            return []  # not this dialog's ACK: an ACK is never answered
        dlg.state = "confirmed"
        dlg.retransmit_at = 0.0
        return [CallEstablished(req.call_id)]

    def _bye(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        dlg = self.dialogs.get(req.call_id)
        if dlg is None or not self._matches(dlg, req):
            return self._no_dialog(req, addr)
        del self.dialogs[req.call_id]
        resp = self._reply(req, 200, "OK", dlg.to_tag)
        return [Outgoing(resp.to_bytes(), addr), CallEnded(req.call_id, "bye")]

    def _cancel(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        dlg = self.dialogs.get(req.call_id)
        # a CANCEL matches the INVITE's transaction: its CSeq number and the caller's tag
        if (dlg is None or dlg.invite.cseq[0] != req.cseq[0]
                or header_tag(req.header("From")) != dlg.from_tag):
            return self._no_dialog(req, addr)
        out: list[Event] = [Outgoing(self._reply(req, 200, "OK", dlg.to_tag).to_bytes(), addr)]
        if dlg.state == "offered":  # not answered yet: the INVITE ends with 487
            terminated = self._reply(dlg.invite, 487, "Request Terminated", dlg.to_tag)
            dlg.final = terminated.to_bytes()
            dlg.state = "rejected"
            del self.dialogs[req.call_id]
            out += [Outgoing(dlg.final, dlg.addr), CallEnded(req.call_id, "cancel")]
        return out

    def _response(self, resp: SipMessage, now: float) -> list[Event]:
        """A response to a request of ours: a REFER's goes to its transfer (matched by CSeq
        and Via branch, RFC 3261 §17.1.3); a BYE's ends its retransmission (a provisional
        one slows it to every T2)."""
        number, method = resp.cseq
        bye = self.byes.get(resp.call_id) if method == "BYE" else None
        if bye is not None and number == bye.cseq:
            if resp.status is not None and resp.status >= 200:
                del self.byes[resp.call_id]
            else:
                bye.interval = T2_S
            return []
        dlg = self.dialogs.get(resp.call_id)
        transfer = dlg.transfer if dlg is not None else None
        if (method != "REFER" or transfer is None or number != transfer.cseq
                or _branch(resp.header("Via")) != transfer.branch):
            return []
        outcome = transfer.on_response(resp)
        return [TransferEnded(resp.call_id, outcome)] if outcome is not None else []

    def _notify(self, req: SipMessage, addr: Address, now: float) -> list[Event]:
        """A NOTIFY of the refer subscription our REFER made (RFC 3515 §2.4.4); any other
        NOTIFY has no subscription here (481)."""
        dlg = self.dialogs.get(req.call_id)
        if dlg is None or not self._matches(dlg, req) or dlg.transfer is None:
            return self._no_dialog(req, addr)
        answer, outcome = dlg.transfer.on_notify(req)
        if answer.status >= 300:
            self.rejected[answer.status] = self.rejected.get(answer.status, 0) + 1
        resp = self._reply(req, answer.status, answer.reason, dlg.to_tag, list(answer.headers))
        out: list[Event] = [Outgoing(resp.to_bytes(), addr)]
        if outcome is not None:
            out.append(TransferEnded(req.call_id, outcome))
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

    def reject(self, call_id: str, status: int, reason: str,
               retry_after: int = 0) -> list[Outgoing]:
        dlg = self.dialogs.pop(call_id, None)
        if dlg is None or dlg.state != "offered":
            return []
        self.rejected[status] = self.rejected.get(status, 0) + 1
        extra = [("Retry-After", str(retry_after))] if retry_after else []
        resp = self._reply(dlg.invite, status, reason, dlg.to_tag, extra)
        return [Outgoing(resp.to_bytes(), dlg.addr)]

    def _request(self, dlg: Dialog, method: str,
                 extra: list[tuple[str, str]]) -> tuple[SipMessage, str]:
        """A request of ours inside ``dlg`` (From and To swap roles, the next local CSeq),
        to the caller's Contact, through the INVITE's Record-Route set (loose routing); and
        its Via branch."""
        inv = dlg.invite
        target = inv.header("Contact").strip("<>").split(">")[0] or inv.header("From")
        if "<" in target:
            target = target.split("<", 1)[1].split(">", 1)[0]
        to = inv.header("To")
        if not header_tag(to):
            to = f"{to};tag={dlg.to_tag}"
        dlg.local_cseq += 1
        branch = f"z9hG4bK{secrets.token_hex(8)}"
        headers = [
            ("Via", f"SIP/2.0/UDP {self.host}:{self.port};branch={branch}"),
            *(("Route", r) for r in inv.header_values("Record-Route")),
            ("Max-Forwards", "70"), ("From", to), ("To", inv.header("From")),
            ("Call-ID", inv.call_id), ("CSeq", f"{dlg.local_cseq} {method}"),
            ("User-Agent", self.user_agent), *extra,
        ]
        return SipMessage(method=method, uri=target.strip(), headers=headers), branch

    def hangup(self, call_id: str, reason: str = "", now: float | None = None) -> list[Outgoing]:
        """We end the call: a BYE inside the dialog (From and To swap roles), sent again by
        ``poll`` until it is answered (timers E and F; ``now``: when it is sent, else the
        first ``poll`` starts its timers). A ``reason`` (``idle``) goes in an RFC 3326
        ``Reason`` header as normal call clearing (Q.850 cause 16) with the reason as its
        text."""
        dlg = self.dialogs.pop(call_id, None)
        if dlg is None or dlg.state not in ("answered", "confirmed"):
            return []
        extra = []
        if reason:
            text = "".join(c for c in reason if c.isprintable() and c not in '"\\')[:64]
            extra.append(("Reason", f'Q.850;cause=16;text="{text}"'))
        bye, _ = self._request(dlg, "BYE", extra)
        data = bye.to_bytes()
        while len(self.byes) >= MAX_PENDING_BYES:
            del self.byes[next(iter(self.byes))]
        self.byes[call_id] = _PendingBye(
            data, dlg.addr, dlg.local_cseq, 0.0 if now is None else now + BYE_TIMEOUT_S,
            0.0 if now is None else now + T1_S)
        return [Outgoing(data, dlg.addr)]

    def refer(self, call_id: str, target: str, now: float,
              timeout_s: float = TRANSFER_TIMEOUT_S) -> list[Outgoing]:
        """Blind-transfer the caller to ``target`` (a URI, or a number or name made one by
        :func:`~transports.sip.transfer.refer_target`): a REFER in the dialog, retransmitted
        by ``poll`` until answered; its outcome is a :class:`TransferEnded` from ``receive``
        (the NOTIFYs) or ``poll`` (refused, or nothing final within ``timeout_s``). Raises
        :class:`~transports.sip.transfer.TransferError` when the call cannot be transferred
        now or the target is refused."""
        dlg = self.dialogs.get(call_id)
        if dlg is None:
            raise TransferError("the call has ended")
        if dlg.state != "confirmed":
            raise TransferError("the call is not set up yet (no ACK)")
        if dlg.transfer is not None and not dlg.transfer.finished:
            raise TransferError(f"a transfer to {dlg.transfer.target} is already under way")
        uri = refer_target(target, dlg.invite.header("From"), _hostport(dlg.addr))
        me = name_addr_uri(dlg.invite.header("To")) or self.contact.strip("<>")
        refer, branch = self._request(dlg, "REFER", [
            ("Contact", self.contact), ("Refer-To", f"<{uri}>"),
            ("Referred-By", f"<{me}>"),
        ])
        data = refer.to_bytes()
        dlg.transfer = Transfer(uri, dlg.local_cseq, branch, data, now, timeout_s)
        return [Outgoing(data, dlg.addr)]

    def _resend_byes(self, now: float) -> list[Event]:
        out: list[Event] = []
        for cid, bye in list(self.byes.items()):
            if not bye.give_up_at:  # hung up without a time: the timers start now
                bye.give_up_at, bye.next_at = now + BYE_TIMEOUT_S, now + T1_S
            elif now >= bye.give_up_at:
                del self.byes[cid]
                self.byes_unanswered += 1
            elif now >= bye.next_at:
                out.append(Outgoing(bye.data, bye.addr))
                bye.interval = min(bye.interval * 2, T2_S)
                bye.next_at = now + bye.interval
        return out

    def poll(self, now: float) -> list[Event]:
        """Timers: retransmit unacknowledged 200 OKs (doubling up to T2) and give up after
        ``ack_timeout_s`` (32 s: timer H); retransmit an unanswered REFER (timer E) and end
        a transfer that runs out of time; retransmit our unanswered BYEs (timers E and F)."""
        out: list[Event] = self._resend_byes(now)
        for cid, dlg in list(self.dialogs.items()):
            if dlg.transfer is not None and not dlg.transfer.finished:
                due = dlg.transfer.poll(now)
                if isinstance(due, bytes):
                    out.append(Outgoing(due, dlg.addr))
                elif due is not None:
                    out.append(TransferEnded(cid, due))
            if dlg.state != "answered" or not dlg.retransmit_at or now < dlg.retransmit_at:
                continue
            if now - dlg.answered_at >= self.ack_timeout_s:
                out += self.hangup(cid, now=now)
                out.append(CallEnded(cid, "no-ack"))
                continue
            out.append(Outgoing(dlg.final, dlg.addr))
            dlg.interval = min(dlg.interval * 2, T2_S)
            dlg.retransmit_at = now + dlg.interval
        return out


def _quotable(text: str) -> str:
    """``text`` fit for a quoted-string header value: printable, no quote or backslash."""
    return "".join(c for c in text if c.isprintable() and c not in '"\\')[:160]


def _branch(via: str) -> str:
    """The ``branch`` parameter of a Via header value."""
    for param in via.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "branch":
            return value.strip()
    return ""


def _hostport(addr: Address) -> str:
    host = addr[0]
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
