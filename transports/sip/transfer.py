"""Blind transfer (RFC 3515 REFER, as RFC 5589 uses it), sans-I/O: the transfer target made into
a URI we will put in a Refer-To, and one REFER's life — its retransmissions over UDP, its
answer, the NOTIFYs whose ``message/sipfrag`` bodies say how the caller's new call is going,
and the outcome. The dialog it runs in belongs to :mod:`transports.sip.uas`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from transports.sip.digits import decimal
from transports.sip.message import SipMessage

T1_S = 0.5  # RFC 3261 timer T1: timer E starts here and doubles...
T2_S = 4.0  # ...up to T2
TIMER_F_S = 64 * T1_S  # a REFER nobody answers is given up after 32 s
TRANSFER_TIMEOUT_S = 30.0  # the caller's new call must have an answer by then
MAX_TARGET = 256

# What a target URI may hold: RFC 3261's URI characters less ``?`` (a Refer-To URI's headers
# are copied into the INVITE the caller sends: ``?Replaces=`` would let a target take over
# another call), ``,`` (a header list), quotes, brackets, spaces and control characters.
_URI_CHARS = re.compile(r"[A-Za-z0-9\-_.!~*'()%;:@&=+$/\[\]]+")
_NUMBER = re.compile(r"\+?[0-9][0-9 ().\-]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_SCHEMES = ("sip:", "sips:", "tel:")


class TransferError(ValueError):
    """A transfer that cannot be asked for: a target we will not refer to, a call that is not
    answered or has ended, a transfer already under way. The text says which."""


def refer_target(target: str, caller: str, fallback_host: str = "") -> str:
    """``target`` as the URI of a Refer-To header.

    The rule: a ``sip:``, ``sips:`` or ``tel:`` URI is taken as it is; ``user@host`` gets
    ``sip:`` in front; a bare phone number (``+1 555 123-4567``: digits, an optional leading
    ``+``, and spaces, dots, dashes and brackets, which are dropped) or a bare name
    (``frontdesk``: letters, digits, ``.``, ``_``, ``-``) becomes ``sip:NUMBER@HOST``, where
    HOST is the host (and port) of the caller's From URI — the PBX or trunk the call came
    from, which knows its own numbers — or ``fallback_host`` (the address the call came from)
    when that URI has none. Anything else, and any URI with characters a header could be
    forged with, raises :class:`TransferError`.
    """
    text = target.strip()
    if not text:
        raise TransferError("no transfer target given")
    if len(text) > MAX_TARGET:
        raise TransferError(f"transfer target longer than {MAX_TARGET} characters")
    low = text.lower()
    if low.startswith(_SCHEMES):
        scheme, _, rest = text.partition(":")
        uri = f"{scheme.lower()}:{rest}"
        if not rest or (scheme.lower() != "tel" and not _user_host(rest)):
            raise TransferError(f"transfer target {_shown(text)} has no host, or an empty user")
    elif "@" in text:
        if not _user_host(text):
            raise TransferError(f"transfer target {_shown(text)} is not user@host")
        uri = f"sip:{text}"
    elif _NUMBER.fullmatch(text):
        number = "".join(c for c in text if c == "+" or c.isdigit())
        uri = f"sip:{number}@{_caller_host(caller, fallback_host)}"
    elif _NAME.fullmatch(text):
        uri = f"sip:{text}@{_caller_host(caller, fallback_host)}"
    else:
        raise TransferError(f"transfer target {_shown(text)} is not a SIP URI, a phone number "
                            "or a name")
    if not _URI_CHARS.fullmatch(uri):
        raise TransferError(f"transfer target {_shown(text)} holds characters a SIP URI in a "
                            "Refer-To may not (spaces, quotes, <>, ',', '?', control characters)")
    return uri


def _user_host(text: str) -> bool:
    """``[user@]host[;params]`` with a host, and a user when there is an ``@``."""
    user, at, host = text.split(";", 1)[0].rpartition("@")
    return bool(host) and (not at or (bool(user) and "@" not in user))


def _shown(text: str) -> str:
    return repr("".join(c if c.isprintable() else "?" for c in text[:64]))


def _caller_host(caller: str, fallback: str) -> str:
    """The host[:port] of a From header's SIP URI (``""`` → ``fallback``)."""
    uri = caller.split("<", 1)[1].split(">", 1)[0] if "<" in caller else caller.split(";", 1)[0]
    uri = uri.strip()
    host = ""
    if uri.lower().startswith(("sip:", "sips:")):
        rest = uri.split(":", 1)[1]
        host = rest.rsplit("@", 1)[-1]
        host = host.split(";", 1)[0].split("?", 1)[0]
    if not host or not _URI_CHARS.fullmatch(host):
        host = fallback
    if not host:
        raise TransferError("a bare number or name needs the caller's host, and the call's "
                            "From header has none: give a full SIP URI")
    return host


def name_addr_uri(value: str) -> str:
    """The URI of a From/To/Contact value (``"Bob" <sip:b@x>;tag=1`` → ``sip:b@x``)."""
    if "<" in value:
        return value.split("<", 1)[1].split(">", 1)[0].strip()
    return value.split(";", 1)[0].strip()


class SipfragError(ValueError):
    pass


def parse_sipfrag(body: bytes) -> tuple[int, str]:
    """The status line of a ``message/sipfrag`` body (RFC 3420): ``(code, reason)``."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SipfragError("sipfrag is not UTF-8") from None
    line = text.lstrip("\r\n").split("\n", 1)[0].strip()
    version, _, rest = line.partition(" ")
    code_text, _, reason = rest.partition(" ")
    code = decimal(code_text, max_digits=3)
    if version != "SIP/2.0" or code is None or not 100 <= code <= 699:
        raise SipfragError(f"not a SIP status line: {line[:48]!r}")
    return code, reason.strip()


class TransferState(enum.Enum):
    CALLING = "calling"  # the REFER is out, not yet answered (timer E retransmits it)
    PROCEEDING = "proceeding"  # a 1xx to it (retransmitted every T2)
    ACCEPTED = "accepted"  # 2xx, or a NOTIFY came: waiting for the new call's final answer
    SUCCEEDED = "succeeded"  # the caller's call to the target was answered
    FAILED = "failed"  # refused, the target failed, or no answer in time


S = TransferState
TRANSITIONS: dict[TransferState, frozenset[TransferState]] = {
    # a NOTIFY may overtake the REFER's 2xx on UDP: it implies the REFER was accepted
    S.CALLING: frozenset({S.PROCEEDING, S.ACCEPTED, S.SUCCEEDED, S.FAILED}),
    S.PROCEEDING: frozenset({S.ACCEPTED, S.SUCCEEDED, S.FAILED}),
    S.ACCEPTED: frozenset({S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
}


@dataclass(slots=True, frozen=True)
class TransferOutcome:
    ok: bool
    status: int  # the final status: the REFER's answer, or the sipfrag's (0: a timeout)
    detail: str  # what happened, in words, for the agent and the log


@dataclass(slots=True, frozen=True)
class NotifyAnswer:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Transfer:
    """One REFER in one dialog: feed it the REFER's responses, the NOTIFYs and the clock."""

    target: str
    cseq: int
    branch: str
    request: bytes  # the REFER as sent, for retransmissions
    started: float
    timeout_s: float = TRANSFER_TIMEOUT_S
    state: TransferState = TransferState.CALLING
    interval: float = T1_S
    retransmit_at: float = 0.0
    progress: list[int] = field(default_factory=list)  # every sipfrag status, in order
    notify_cseq: int = 0  # the last NOTIFY's CSeq (a retransmission is answered, not re-read)
    outcome: TransferOutcome | None = None

    def __post_init__(self) -> None:
        self.retransmit_at = self.started + T1_S

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def _move(self, to: TransferState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise AssertionError(f"transfer: {self.state.value} -> {to.value}")
        self.state = to

    def _end(self, ok: bool, status: int, detail: str) -> TransferOutcome:
        self._move(TransferState.SUCCEEDED if ok else TransferState.FAILED)
        self.outcome = TransferOutcome(ok, status, detail)
        return self.outcome

    def on_response(self, msg: SipMessage) -> TransferOutcome | None:
        """A response to our REFER (the caller matched it by CSeq and branch)."""
        if self.finished or self.state is TransferState.ACCEPTED:
            return None  # a retransmitted answer, or one the NOTIFYs overtook
        if msg.status < 200:
            if self.state is TransferState.CALLING:
                self._move(TransferState.PROCEEDING)
            return None
        if msg.status < 300:
            self._move(TransferState.ACCEPTED)
            return None
        return self._end(False, msg.status,
                         f"the transfer to {self.target} was refused: {msg.status} "
                         f"{_reason(msg.reason)}")

    def on_notify(self, msg: SipMessage) -> tuple[NotifyAnswer, TransferOutcome | None]:
        """A NOTIFY of the refer subscription (in our dialog): how to answer it, and the
        outcome when its sipfrag is final."""
        event = msg.header("Event")
        kind, *params = [p.strip() for p in event.split(";")]
        if kind.lower() != "refer":
            return NotifyAnswer(489, "Bad Event", (("Allow-Events", "refer"),)), None
        for p in params:
            name, _, value = p.partition("=")
            if name.strip().lower() == "id" and value.strip() != str(self.cseq):
                return NotifyAnswer(481, "Subscription Does Not Exist"), None
        ctype = msg.header("Content-Type").split(";", 1)[0].strip().lower()
        if ctype != "message/sipfrag":
            return NotifyAnswer(415, "Unsupported Media Type",
                                (("Accept", "message/sipfrag"),)), None
        try:
            code, reason = parse_sipfrag(msg.body)
        except SipfragError:
            return NotifyAnswer(400, "Bad Request (the body is not a sipfrag status line)"), None
        ok = NotifyAnswer(200, "OK")
        number = msg.cseq[0]
        if number <= self.notify_cseq or self.finished:
            return ok, None  # a retransmission, or news after the outcome
        self.notify_cseq = number
        self.progress.append(code)
        if self.state in (TransferState.CALLING, TransferState.PROCEEDING):
            self._move(TransferState.ACCEPTED)  # the REFER's 2xx is late or lost
        if 200 <= code < 300:
            return ok, self._end(True, code, f"transferred to {self.target}")
        if code >= 300:
            return ok, self._end(False, code, f"the transfer to {self.target} failed: "
                                              f"{code} {_reason(reason)}")
        state = msg.header("Subscription-State").split(";", 1)[0].strip().lower()
        if state == "terminated":
            return ok, self._end(False, code, f"the transfer to {self.target} ended without "
                                              f"an answer (last heard: {code} {_reason(reason)})")
        return ok, None

    def poll(self, now: float) -> bytes | TransferOutcome | None:
        """The REFER to send again, the outcome of running out of time, or nothing."""
        if self.finished:
            return None
        waiting = self.state in (TransferState.CALLING, TransferState.PROCEEDING)
        if now - self.started >= self.timeout_s:
            what = "no answer to the REFER" if waiting else "no final NOTIFY"
            return self._end(False, 0, f"the transfer to {self.target} timed out ({what} "
                                       f"within {self.timeout_s:g} s)")
        if not waiting or now < self.retransmit_at:
            return None
        if now - self.started >= TIMER_F_S:
            return self._end(False, 408, f"the transfer to {self.target} got no answer to its "
                                         "REFER (timer F)")
        if self.state is TransferState.CALLING:
            self.interval = min(self.interval * 2, T2_S)
        else:
            self.interval = T2_S
        self.retransmit_at = now + self.interval
        return self.request


def _reason(text: str) -> str:
    return "".join(c for c in text if c.isprintable())[:64]
