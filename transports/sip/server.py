"""The asyncio UDP shell around the sans-I/O ``UserAgentServer``: one SIP socket for every call,
one RTP socket and one ``Session`` per call, created on INVITE and freed on BYE or CANCEL, or
when the agent hangs up (a BYE of ours, once its last words have played)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from agent.session import Session
from transports.g711 import PCMA, PCMU
from transports.lifecycle import CallLifecycle
from transports.rtp.call import MediaStats
from transports.rtp.stream import RtpMediaStream
from transports.sip.sdp import build_answer
from transports.sip.uas import (
    Address,
    CallEnded,
    CallEstablished,
    CallOffered,
    Event,
    Outgoing,
    UserAgentServer,
)

log = logging.getLogger("voxline.sip")
SessionFactory = Callable[[], Session | Awaitable[Session]]
# after the agent's last packet, the caller's jitter buffer still holds some of its audio: the
# BYE of an agent hang-up waits this long so the caller hears the goodbye to its end
HANGUP_LINGER_S = 0.2


@dataclass(slots=True)
class SipCall:
    call_id: str
    session: Session
    media: RtpMediaStream
    life: CallLifecycle
    started: float = field(default_factory=time.monotonic)
    hangup_watch: asyncio.Task[None] | None = None  # waits for the agent to end the call


@dataclass(slots=True, frozen=True)
class CallReport:
    """What a finished call leaves behind (for logs, tests and benchmarks)."""

    call_id: str
    reason: str
    seconds: float
    media: MediaStats
    jitter: dict[str, int]
    summary: dict[str, Any]
    turns: list[dict[str, Any]]


class SipServer(asyncio.DatagramProtocol):
    """``await start()`` binds ``host:port``; each call gets an RTP port from ``rtp_ports``.

    ``media_address`` is what the SDP answer tells the caller to send RTP to (the host behind
    NAT would put its public address there). ``on_call`` sees each new call (its session and
    media stream) before the session starts, so an application can listen to its frames.
    """

    def __init__(
        self,
        session_factory: SessionFactory,
        host: str = "127.0.0.1",
        port: int = 5060,
        rtp_ports: tuple[int, int] = (40000, 40999),
        media_address: str = "",
        max_calls: int = 100,
        on_call: Callable[[SipCall], None] | None = None,
        on_end: Callable[[CallReport], None] | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.host, self.port = host, port
        self.rtp_ports = rtp_ports
        self.media_address = media_address or host
        self.on_call = on_call
        self.on_end = on_end
        self.uas = UserAgentServer(host, port, max_calls=max_calls)
        self.calls: dict[str, SipCall] = {}
        self.reports: list[CallReport] = []
        self._transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._next_rtp = rtp_ports[0]
        self.crashes = 0

    # --- life --------------------------------------------------------------------------------
    async def start(self) -> Address:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=(self.host, self.port)
        )
        self._transport = transport  # type: ignore[assignment]
        self.host, self.port = transport.get_extra_info("sockname")[:2]
        self.uas.host, self.uas.port = self.host, self.port
        self._timer = loop.create_task(self._timers())
        return self.host, self.port

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for cid in list(self.calls):
            self._send(self.uas.hangup(cid))
            await self._end(cid, "shutdown")
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._transport is not None:
            self._transport.close()

    async def hangup(self, call_id: str, reason: str = "hangup") -> None:
        """The agent ends a call: BYE to the caller (``reason`` in its Reason header), then
        the session is closed with ``reason``."""
        self._send(self.uas.hangup(call_id, reason))
        await self._end(call_id, reason)

    async def _watch_hangup(self, call: SipCall) -> None:
        """A stage of the call's pipeline ended it: BYE once its last words have played."""
        reason = await call.life.agent_hangup()
        await asyncio.sleep(HANGUP_LINGER_S)
        await self.hangup(call.call_id, reason)

    async def _timers(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self._handle(self.uas.poll(time.monotonic()))

    # --- datagrams ---------------------------------------------------------------------------
    def datagram_received(self, data: bytes, addr: Address) -> None:
        try:
            self._handle(self.uas.receive(data, addr, time.monotonic()))
        except Exception:  # a bug here must cost one datagram, never the server
            self.crashes += 1
            log.exception("SIP datagram from %s:%d not handled", *addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("SIP socket error: %s", exc)

    def _send(self, out: list[Outgoing]) -> None:
        if self._transport is None:
            return
        for o in out:
            self._transport.sendto(o.data, o.addr)

    def _handle(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, Outgoing):
                self._send([ev])
            elif isinstance(ev, CallOffered):
                self._spawn(self._answer(ev))
            elif isinstance(ev, CallEstablished):
                call = self.calls.get(ev.call_id)
                if call is not None:
                    call.media.start()
            elif isinstance(ev, CallEnded):
                self._spawn(self._end(ev.call_id, ev.reason))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- calls -------------------------------------------------------------------------------
    async def _answer(self, offer: CallOffered) -> None:
        media: RtpMediaStream | None = None
        life: CallLifecycle | None = None
        try:
            made = self.session_factory()
            session = await made if inspect.isawaitable(made) else made
            life = CallLifecycle(session)
            codec = PCMU if offer.answer.codec == "PCMU" else PCMA
            media = RtpMediaStream(session, codec, (offer.offer.address, offer.offer.port),
                                   dtmf_payload_type=offer.answer.telephone_event)
            port = await self._open_rtp(media)
            call = SipCall(offer.call_id, session, media, life)
            if self.on_call is not None:
                self.on_call(call)
            await life.start()  # closes the session itself when the start fails
        except Exception:
            log.exception("call %s: could not set up the session", offer.call_id)
            self._send(self.uas.reject(offer.call_id, 500, "Server Internal Error"))
            if media is not None:
                await media.close()
            if life is not None:
                await life.close("error")
            return
        if offer.call_id not in self.uas.dialogs:  # CANCELled while we were setting up
            await media.close()
            await life.close("cancel")
            return
        self.calls[offer.call_id] = call
        call.hangup_watch = self._spawn(self._watch_hangup(call))
        answer = build_answer(offer.answer, self.media_address, port)
        self._send(self.uas.accept(offer.call_id, answer, time.monotonic()))

    async def _open_rtp(self, media: RtpMediaStream) -> int:
        lo, hi = self.rtp_ports
        span = (hi - lo) // 2 + 1
        for _ in range(span):
            port = self._next_rtp
            self._next_rtp = port + 2 if port + 2 <= hi else lo  # even ports, RTCP would be +1
            try:
                return (await media.open(self.host, port))[1]
            except OSError:
                continue
        raise OSError(f"no free RTP port in {lo}-{hi}")

    async def _end(self, call_id: str, reason: str) -> None:
        call = self.calls.pop(call_id, None)
        if call is None:
            return
        if call.hangup_watch is not None and call.hangup_watch is not asyncio.current_task():
            call.hangup_watch.cancel()
        await call.media.close()
        summary = await call.life.close(reason)
        js = call.media.jitter.stats
        report = CallReport(
            call_id, reason, time.monotonic() - call.started, call.media.stats,
            {"received": js.received, "lost": js.lost, "late": js.late,
             "duplicate": js.duplicate, "reordered": js.reordered},
            summary, list(call.session.trace.turns),
        )
        self.reports.append(report)
        if self.on_end is not None:
            self.on_end(report)
        log.info("call %s ended (%s) after %.1f s", call_id, reason, report.seconds)
