"""The asyncio UDP shell around the sans-I/O ``UserAgentServer``: one SIP socket for every call,
one RTP socket and one ``Session`` per call, created on INVITE and freed on BYE or CANCEL, or
when the agent hangs up (a BYE of ours, once its last words have played), or when the caller's
RTP stops for ``rtp_timeout_s``, or when a transfer of it succeeded (``"transferred"``), or at
shutdown. However a call ends — whatever its media task raised — its session is closed: its ASR
slot, tasks and RTP socket are freed. An established call's session gets a
:class:`~transports.sip.control.SipCallControl` as ``session.control``."""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.control import CallControlError
from agent.errors import CapacityError
from agent.ops import Check, Health, OpsEndpoints, Sample
from agent.session import Session
from transports.g711 import PCMA, PCMU
from transports.lifecycle import CallLifecycle
from transports.ratelimit import InviteRateLimit
from transports.rtp.call import MediaStats
from transports.rtp.stream import RtpMediaStream
from transports.sip.control import SipCallControl
from transports.sip.message import uri_user
from transports.sip.sdp import build_answer
from transports.sip.transfer import TRANSFER_TIMEOUT_S
from transports.sip.uas import (
    ACK_TIMEOUT_S,
    BUSY_RETRY_AFTER_S,
    SHUTDOWN_RETRY_AFTER_S,
    Address,
    CallEnded,
    CallEstablished,
    CallOffered,
    Event,
    MediaChanged,
    Network,
    Outgoing,
    TransferEnded,
    UserAgentServer,
)

REPORTS_KEPT = 100  # end records a server keeps in memory (its on_end callback sees all)
log = logging.getLogger("voxline.sip")
SessionFactory = Callable[[], Session | Awaitable[Session]]
ECHO_USER = "echo"  # the Request-URI user of the echo test
# after the agent's last packet, the caller's jitter buffer still holds some of its audio: the
# BYE of an agent hang-up waits this long so the caller hears the goodbye to its end
HANGUP_LINGER_S = 0.2
# a caller that sends no RTP for this long is gone (a crashed phone, a lost BYE, a flood of
# INVITE+ACK pairs): the call is ended with a BYE. Calls on hold with no RTP at all are cut too.
RTP_TIMEOUT_S = 30.0
# the session factory and the session's start must be done by then, or the call is refused
SETUP_TIMEOUT_S = 20.0


@dataclass(slots=True)
class SipCall:
    call_id: str
    session: Session
    media: RtpMediaStream
    life: CallLifecycle
    started: float = field(default_factory=time.monotonic)
    hangup_watch: asyncio.Task[None] | None = None  # waits for the agent to end the call
    ending: bool = False  # a hang-up of ours is under way
    transfer: asyncio.Future[str] | None = None  # the outcome of a REFER under way


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

    Limits (see :class:`~transports.sip.uas.UserAgentServer` for what each refusal answers):
    ``max_calls`` at once; ``invite_rate`` new INVITEs a second per source address, ``burst``
    at once (``invite_rate=0``: no limit); ``max_calls_per_source``; ``media_peers``, the
    networks an offer may name for its media besides the INVITE's source; ``rtp_timeout_s``
    of caller silence on the wire ends a call (0: never); ``ack_timeout_s`` ends an answered
    call that is never ACKed.

    Transfers (``session.control.transfer``): ``transfer_to`` is the target when the agent
    names none; ``transfer_timeout_s`` is how long the caller's new call may take to be
    answered before the transfer counts as failed (the call goes on).

    The echo test (``echo_session_factory``): an INVITE whose Request-URI names the user
    ``echo_user`` (``sip:echo@host``) gets a session from that factory instead, one that plays
    the caller's audio back (:mod:`stages.echo_test`).
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
        *,
        media_peers: Iterable[str | Network] = (),
        invite_rate: float = 10.0,
        invite_burst: int = 20,
        max_calls_per_source: int = 0,
        rtp_timeout_s: float = RTP_TIMEOUT_S,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        setup_timeout_s: float = SETUP_TIMEOUT_S,
        ready_checks: tuple[Check, ...] = (),
        transfer_to: str = "",
        transfer_timeout_s: float = TRANSFER_TIMEOUT_S,
        echo_session_factory: SessionFactory | None = None,
        echo_user: str = ECHO_USER,
    ) -> None:
        self.session_factory = session_factory
        self.echo_session_factory = echo_session_factory
        self.echo_user = echo_user
        self.host, self.port = host, port
        self.rtp_ports = rtp_ports
        self.media_address = media_address or host
        self.on_call = on_call
        self.on_end = on_end
        self.rtp_timeout_s = rtp_timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.transfer_to = transfer_to
        self.transfer_timeout_s = transfer_timeout_s
        self.uas = UserAgentServer(
            host, port, max_calls=max_calls, media_peers=media_peers,
            invite_rate=InviteRateLimit(invite_rate, invite_burst),
            max_calls_per_source=max_calls_per_source, ack_timeout_s=ack_timeout_s)
        self.calls: dict[str, SipCall] = {}
        # the last REPORTS_KEPT calls' end records (a server runs for months: all of them
        # would grow without bound); ``ended`` counts every call
        self.reports: deque[CallReport] = deque(maxlen=REPORTS_KEPT)
        self.ended = 0
        self._transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ports = random.SystemRandom()
        self.crashes = 0
        self._ending: set[str] = set()  # calls ended, their sessions closing
        # RTP dropped by the calls that ended (the live calls' counts are added at a scrape)
        self.rtp_dropped = {"foreign": 0, "stray_ssrc": 0, "malformed": 0, "send_errors": 0}
        # /healthz, /readyz and /metrics on --metrics-port (SIP has no HTTP of its own)
        self.health = Health(self.stats, [self._room, *ready_checks], loaded=True)
        self.ops = OpsEndpoints(self.health)

    # --- operating it ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {"calls": len(self.calls), "ended": self.ended, "crashes": self.crashes,
                "rejected": {str(k): v for k, v in sorted(self.uas.rejected.items())}}

    def _room(self) -> str:
        most = self.uas.max_calls
        return "" if len(self.uas.dialogs) < most else f"at its limit of {most} calls"

    def begin_drain(self) -> None:
        """Take no new call (an INVITE gets 503 with a Retry-After); live calls go on."""
        self.uas.draining = self.health.draining = True

    @property
    def live_calls(self) -> int:
        # calls being set up, answered, or ended on the wire and still closing their session
        return len(self.uas.dialogs.keys() | self.calls.keys() | self._ending)

    def metric_samples(self) -> list[Sample]:
        dropped = dict(self.rtp_dropped)
        for call in self.calls.values():
            for key, n in _rtp_dropped(call.media.stats).items():
                dropped[key] += n
        refused = "INVITEs answered with an error, by status (503: limits and draining)."
        rtp = "RTP datagrams dropped or not sent, by cause."
        return [
            Sample("voxline_calls_admitted", "gauge", "SIP dialogs held (set up or answered).",
                   len(self.uas.dialogs)),
            Sample("voxline_calls_max", "gauge", "Calls served at once (--max-calls).",
                   self.uas.max_calls),
            Sample("voxline_draining", "gauge", "1 while the server drains (SIGTERM).",
                   int(self.uas.draining)),
            *(Sample("voxline_sip_invites_refused", "counter", refused, n, (("status", str(code)),))
              for code, n in sorted(self.uas.rejected.items())),
            *(Sample("voxline_rtp_dropped", "counter", rtp, n, (("cause", cause),))
              for cause, n in dropped.items()),
            Sample("voxline_sip_byes_unanswered", "counter",
                   "BYEs of ours never answered, sent again until timer F (32 s) gave up.",
                   self.uas.byes_unanswered),
        ]

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
        """Shut down: new INVITEs get 503 with a Retry-After while the live calls end (a BYE
        each, reason ``shutdown``, and their end reports), then the socket closes."""
        self.begin_drain()
        if self._timer is not None:
            self._timer.cancel()
        for cid in list(self.uas.dialogs):
            if cid not in self.calls:  # still being set up: its INVITE gets a final answer
                self._send(self.uas.reject(cid, 503, "Service Unavailable (shutting down)",
                                           retry_after=SHUTDOWN_RETRY_AFTER_S))
        for cid in list(self.calls):
            self._send(self.uas.hangup(cid, "shutdown", time.monotonic()))
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
        self._send(self.uas.hangup(call_id, reason, time.monotonic()))
        await self._end(call_id, reason)

    async def transfer(self, call_id: str, target: str) -> str:
        """Blind-transfer a call (see :class:`~transports.sip.control.SipCallControl`):
        returns ``"transferred to URI"`` once the caller's new call is answered (the BYE and
        the end of the call, reason ``"transferred"``, follow on their own task, so a stage of
        the call may await this); raises ``CallControlError`` when it failed, and
        ``TransferError`` when it cannot be asked for."""
        call = self.calls.get(call_id)
        if call is None or call.ending:
            raise CallControlError("the call has ended")
        out = self.uas.refer(call_id, target, time.monotonic(), self.transfer_timeout_s)
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieved)  # (nobody may be waiting when it fails)
        call.transfer = done
        self._send(out)
        # (shielded: a caller that stops waiting leaves the transfer running, and its outcome
        # still ends the call when it worked)
        return await asyncio.shield(done)

    def _transferred(self, ev: TransferEnded) -> None:
        call = self.calls.get(ev.call_id)
        if call is None:
            return
        done, call.transfer = call.transfer, None
        outcome = ev.outcome
        if outcome.ok:
            log.info("call %s: %s", ev.call_id, outcome.detail)
            if done is not None and not done.done():
                done.set_result(outcome.detail)
            if not call.ending:
                call.ending = True
                self._spawn(self.hangup(ev.call_id, "transferred"))
        else:
            log.warning("call %s: %s", ev.call_id, outcome.detail)
            if done is not None and not done.done():
                done.set_exception(CallControlError(outcome.detail))

    async def _watch_hangup(self, call: SipCall) -> None:
        """A stage of the call's pipeline ended it: BYE once its last words have played."""
        reason = await call.life.agent_hangup()
        await asyncio.sleep(HANGUP_LINGER_S)
        await self.hangup(call.call_id, reason)

    async def _timers(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            try:
                self._handle(self.uas.poll(time.monotonic()))
                self._check_media(time.monotonic_ns())
            except Exception:  # a bug here must cost one tick, never every call's timers
                self.crashes += 1
                log.exception("SIP timers failed")

    def _check_media(self, now_ns: int) -> None:
        """End the calls whose media task died or whose caller went silent on the wire."""
        timeout_ns = int(self.rtp_timeout_s * 1e9)
        for cid, call in list(self.calls.items()):
            if call.ending:
                continue
            if call.media.failed is not None:
                call.ending = True
                log.error("call %s: media failed: %r", cid, call.media.failed)
                self._spawn(self.hangup(cid, "error"))
            elif timeout_ns > 0 and call.media.silent_ns(now_ns) >= timeout_ns:
                call.ending = True
                log.info("call %s: no RTP for %.0f s, hanging up", cid, self.rtp_timeout_s)
                self._spawn(self.hangup(cid, "rtp-timeout"))

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
                    call.session.control = SipCallControl(self, call.call_id, call.media,
                                                          self.transfer_to)
                    call.media.start()
            elif isinstance(ev, TransferEnded):
                self._transferred(ev)
            elif isinstance(ev, MediaChanged):
                call = self.calls.get(ev.call_id)
                if call is not None:
                    call.media.retarget((self._socket_host(ev.offer.address), ev.offer.port))
            elif isinstance(ev, CallEnded):
                self._spawn(self._end(ev.call_id, ev.reason))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- calls -------------------------------------------------------------------------------
    def _factory(self, request_uri: str) -> SessionFactory:
        """The echo test for ``sip:<echo_user>@…`` (when there is one), else the agent."""
        if self.echo_session_factory is not None and uri_user(request_uri) == self.echo_user:
            return self.echo_session_factory
        return self.session_factory

    async def _answer(self, offer: CallOffered) -> None:
        media: RtpMediaStream | None = None
        life: CallLifecycle | None = None
        call: SipCall | None = None  # once made, on_call has seen it: it must see its end too
        try:
            async with asyncio.timeout(self.setup_timeout_s):
                made = self._factory(offer.callee)()
                session = await made if inspect.isawaitable(made) else made
                life = CallLifecycle(session)
                codec = PCMU if offer.answer.codec == "PCMU" else PCMA
                remote = (self._socket_host(offer.offer.address), offer.offer.port)
                media = RtpMediaStream(session, codec, remote,
                                       dtmf_payload_type=offer.answer.telephone_event)
                port = await self._open_rtp(media)
                call = SipCall(offer.call_id, session, media, life)
                if self.on_call is not None:
                    self.on_call(call)
                await life.start()  # closes the session itself when the start fails
        except asyncio.CancelledError:  # the server stops: nothing of the call may stay
            await self._release(media, life, "shutdown")
            raise
        except Exception as err:
            if isinstance(err, CapacityError | TimeoutError):
                # full (no ASR slot) or too slow: this server cannot take a call now, another
                # may (a proxy fails over on 503), and this one soon again
                log.warning("call %s refused: %s", offer.call_id,
                            err if isinstance(err, CapacityError) else "set-up timed out")
                self._send(self.uas.reject(offer.call_id, 503, "Service Unavailable",
                                           retry_after=BUSY_RETRY_AFTER_S))
                reason = "refused"
            else:
                log.exception("call %s: could not set up the session", offer.call_id)
                self._send(self.uas.reject(offer.call_id, 500, "Server Internal Error"))
                reason = "error"
            summary = await self._release(media, life, reason)
            if call is not None:
                self._report(call, reason, summary)
            return
        if offer.call_id not in self.uas.dialogs:  # CANCELled while we were setting up
            summary = await self._release(media, life, "cancel")
            if call is not None:
                self._report(call, "cancel", summary)
            return
        self.calls[offer.call_id] = call
        call.hangup_watch = self._spawn(self._watch_hangup(call))
        answer = build_answer(offer.answer, self.media_address, port)
        self._send(self.uas.accept(offer.call_id, answer, time.monotonic()))

    def _socket_host(self, address: str) -> str:
        """``address`` as our RTP socket (bound to ``host``) names it: an IPv4 peer of an IPv6
        (dual-stack) socket is ``::ffff:a.b.c.d``, which is also what its packets come from."""
        try:
            ours = ipaddress.ip_address(self.host.split("%", 1)[0]).version
        except ValueError:
            return address
        if ours == 6 and ipaddress.ip_address(address).version == 4:
            return f"::ffff:{address}"
        return address

    async def _open_rtp(self, media: RtpMediaStream) -> int:
        """Bind an even port of ``rtp_ports`` picked at random (a caller cannot guess the
        next call's port from its own), trying others while they are taken."""
        lo, hi = self.rtp_ports
        first = lo + lo % 2
        evens = range(first, hi + 1, 2)
        if not evens:
            raise OSError(f"no even RTP port in {lo}-{hi}")
        for _ in range(min(len(evens), 16)):
            try:
                return (await media.open(self.host, self._ports.choice(evens)))[1]
            except OSError:
                continue
        start = self._ports.randrange(len(evens))  # busy range: walk it all, once
        for i in range(len(evens)):
            try:
                return (await media.open(self.host, evens[(start + i) % len(evens)]))[1]
            except OSError:
                continue
        raise OSError(f"no free RTP port in {lo}-{hi}")

    @staticmethod
    async def _release(media: RtpMediaStream | None, life: CallLifecycle | None,
                       reason: str) -> dict[str, Any]:
        """Free a call's socket and session, each whatever the other's close raised."""
        summary: dict[str, Any] = {}
        try:
            if media is not None:
                await media.close()
        except Exception:
            log.exception("closing a call's RTP failed")
        finally:
            if life is not None:
                try:
                    summary = await life.close(reason)
                except Exception:
                    log.exception("closing a call's session failed")
        return summary

    async def _end(self, call_id: str, reason: str) -> None:
        call = self.calls.pop(call_id, None)
        if call is None:
            return
        if call.hangup_watch is not None and call.hangup_watch is not asyncio.current_task():
            call.hangup_watch.cancel()
        if call.transfer is not None and not call.transfer.done():
            call.transfer.set_exception(CallControlError(
                f"the call ended ({reason}) before the transfer was answered"))
        self._ending.add(call_id)  # (still live for a drain until its end record is out)
        try:
            self._report(call, reason, await self._release(call.media, call.life, reason))
        finally:
            self._ending.discard(call_id)

    def _report(self, call: SipCall, reason: str, summary: dict[str, Any]) -> None:
        """The end record of ``call``, which ``on_call`` saw start (every such call gets one,
        refused and cancelled ones too)."""
        call_id = call.call_id
        js = call.media.jitter.stats
        report = CallReport(
            call_id, reason, time.monotonic() - call.started, call.media.stats,
            {"received": js.received, "lost": js.lost, "late": js.late,
             "duplicate": js.duplicate, "reordered": js.reordered},
            summary, list(call.session.trace.turns),
        )
        self.reports.append(report)
        self.ended += 1
        for key, n in _rtp_dropped(call.media.stats).items():
            self.rtp_dropped[key] += n
        if self.on_end is not None:
            try:
                self.on_end(report)
            except Exception:
                log.exception("call %s: on_end failed", call_id)
        log.info("call %s ended (%s) after %.1f s", call_id, reason, report.seconds)


def _rtp_dropped(st: MediaStats) -> dict[str, int]:
    return {"foreign": st.foreign, "stray_ssrc": st.stray_ssrc, "malformed": st.malformed,
            "send_errors": st.send_errors}


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()
