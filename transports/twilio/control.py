"""Call control over Twilio: transfer a call to a ``<Dial>`` (through Twilio's REST "update
call" request when the account's credentials are configured, else through the action endpoint
after the stream closes), and the reason a Media Stream cannot press keys.

The keypad needs nothing here: the stream's ``dtmf`` messages become ``Dtmf`` frames
(:mod:`transports.twilio.call`), which the session's keypad hears.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from agent.control import CallControlError, NotSupported
from agent.frames import HangUp
from agent.session import Session
from transports.twilio.call import TwilioCall
from transports.twilio.handover import TransferBook
from transports.twilio.rest import ACCOUNT_SID_HELP, TwilioRest
from transports.twilio.twiml import dial_twiml

log = logging.getLogger("voxline.twilio")

TRANSFERRED = "transferred"  # the call's end reason after a transfer
# a REST transfer first lets the agent's audio already sent play out (Twilio cuts the stream at
# once), at most this long; then Twilio ends the stream, or we do after STOP_WAIT_S
PLAYED_OUT_WAIT_S = 3.0
STOP_WAIT_S = 10.0
POLL_S = 0.02

NO_DTMF = ("Twilio Media Streams cannot press keys on the call: a bidirectional stream takes "
           "only media, mark and clear messages, and Twilio's <Play digits> would replace the "
           "call's TwiML, ending this stream")


class TwilioCallControl:
    """What the agent may do to one Twilio call (:class:`agent.control.CallControl`).

    ``rest``: the account's credentials; a transfer is then one "update call" request, and
    Twilio itself ends the stream (its ``stop`` closes the session, reason ``"transferred"``).
    Without them, ``book`` (the server's :class:`TransferBook`): a transfer records the
    ``<Dial>`` and ends the stream like an agent hang-up (once the agent's audio has played),
    and the action endpoint answers it; ``armed``: this call's TwiML came from our webhook, so
    Twilio will ask that endpoint (without it, closing the stream would just end the call).
    """

    transport = "twilio"

    def __init__(self, call: TwilioCall, session: Session, rest: TwilioRest | None = None,
                 book: TransferBook | None = None, armed: bool = False) -> None:
        self.call, self.session = call, session
        self.rest, self.book, self.armed = rest, book, armed
        self.transferred = ""  # the target, once Twilio took the call (the REST way)
        self._busy = False
        self._request: asyncio.Future[object] | None = None  # the REST update in flight

    async def settled(self, wait_s: float = 10.0) -> None:
        """Wait (at most ``wait_s``) for a REST update still in flight: Twilio may end the
        stream (``stop``) before its answer to the update reaches us."""
        if self._request is not None and not self._request.done():
            with contextlib.suppress(Exception, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._request), wait_s)

    async def transfer(self, target: str) -> str:
        try:
            twiml = dial_twiml(target)
        except ValueError as exc:
            raise CallControlError(str(exc)) from None
        if self.rest is None and (self.book is None or not self.armed):
            raise NotSupported(
                "this Twilio call cannot be transferred: without REST credentials "
                f"({ACCOUNT_SID_HELP}, with the auth token) a call is handed over only after "
                "its stream, through the <Redirect> that this server's TwiML webhook adds, and "
                "this call's TwiML did not come from that webhook")
        if self._busy or self.transferred:
            raise CallControlError("this call is already being transferred")
        if self.session.closed or self.call.stopped:
            raise CallControlError("the call has ended")
        if self.session.hangup_reason:
            raise CallControlError(f"the call is already ending ({self.session.hangup_reason})")
        self._busy = True
        try:
            if self.rest is not None:
                return await self._by_rest(target, twiml)
            assert self.book is not None
            self.book.record(self.call.call_sid, twiml, time.monotonic())
            self.session.push(HangUp(TRANSFERRED))  # the stream closes once the audio played
            log.info("call %s: handing over to %s after the stream", self.call.call_sid, target)
            return (f"the call goes to {target} as soon as the agent's last words have played "
                    "(the stream then ends)")
        finally:
            self._busy = False

    async def _by_rest(self, target: str, twiml: str) -> str:
        assert self.rest is not None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + PLAYED_OUT_WAIT_S
        while not (self.session.playout.idle and self.call.played_out) and loop.time() < give_up:
            await asyncio.sleep(POLL_S)
        if self.session.closed or self.call.stopped:
            raise CallControlError("the call ended before it could be transferred")
        request = asyncio.ensure_future(self.rest.update_call(self.call.call_sid, twiml))
        self._request = request

        def took(done: asyncio.Future[object]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.transferred = target  # (even if the tool that asked was cancelled)

        request.add_done_callback(took)
        await asyncio.shield(request)
        log.info("call %s: Twilio took the transfer to %s", self.call.call_sid, target)
        self.session.ctx.spawn(self._end_unless_twilio_does(), name="twilio-transfer-stop")
        return f"Twilio took the call and is connecting it to {target}"

    async def _end_unless_twilio_does(self) -> None:
        """Twilio ends the stream after an update; should its ``stop`` not come, we end it."""
        await asyncio.sleep(STOP_WAIT_S)
        if not self.session.closed:
            log.warning("call %s: no stop %g s after the transfer; closing the stream",
                        self.call.call_sid, STOP_WAIT_S)
            self.session.push(HangUp(TRANSFERRED))

    async def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> None:
        raise NotSupported(NO_DTMF)
