"""What the agent may do to a SIP call (:class:`agent.control.CallControl`): blind transfer by
REFER, and keypad digits sent as RFC 4733 events on the call's RTP. The SIP server puts one on
``session.control`` once the call is established."""

from __future__ import annotations

from typing import Protocol

from agent.control import DIGITS, CallControlError, NotSupported
from transports.rtp.stream import RtpMediaStream
from transports.sip.transfer import TransferError


class Transferrer(Protocol):
    """What the control needs of the SIP server (:meth:`SipServer.transfer`)."""

    async def transfer(self, call_id: str, target: str) -> str: ...


class SipCallControl:
    """``transfer(target)`` refers the caller to ``target`` (empty: ``default_target``, the
    server's ``--transfer-to``) and returns once the caller's new call is answered; the server
    then sends BYE and ends the call with reason ``"transferred"``. A refusal, a failed new
    call or no answer within the server's ``transfer_timeout_s`` raises
    :class:`~agent.control.CallControlError` and the call goes on. See
    :func:`~transports.sip.transfer.refer_target` for the targets taken (a bare number or name
    is made a SIP URI at the caller's host).

    ``send_dtmf`` presses keys on the line (RFC 4733, the payload type the caller's offer gave
    telephone-event); the agent's audio waits while they play.
    """

    transport = "sip"

    def __init__(self, server: Transferrer, call_id: str, media: RtpMediaStream,
                 default_target: str = "") -> None:
        self.server = server
        self.call_id = call_id
        self.media = media
        self.default_target = default_target

    async def transfer(self, target: str = "") -> str:
        chosen = target.strip() or self.default_target
        if not chosen:
            raise CallControlError("no transfer target: name one, or start the server with "
                                   "--transfer-to URI")
        try:
            return await self.server.transfer(self.call_id, chosen)
        except TransferError as err:
            raise CallControlError(str(err)) from None

    async def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> None:
        keys = digits.replace(" ", "").upper()
        if not keys or not DIGITS.issuperset(keys):
            raise CallControlError(f"cannot press {digits[:32]!r}: keys are 0-9, *, # and A-D")
        if self.media.call.dtmf_payload_type is None:
            raise NotSupported("the caller's SDP has no telephone-event")
        try:
            await self.media.send_dtmf(keys, duration_ms, gap_ms)
        except ValueError as err:  # a length out of range
            raise CallControlError(str(err)) from None
