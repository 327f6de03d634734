"""The asyncio shell of one call's media: a UDP socket around the sans-I/O
:class:`~transports.rtp.call.RtpCall`. Datagrams go into the call as they arrive; a sender task
sleeps until the call's next packet time and sends what its ``tick`` returns.

Nothing the peer or the network does can stop a call from ending cleanly: a packet the socket
refuses to send is counted (``send_errors``), and :meth:`RtpMediaStream.close` always closes the
socket and never raises, whatever became of the sender task.
"""

from __future__ import annotations

import asyncio
import logging
import time

from agent.control import CallControlError
from agent.pacer import Pacer
from agent.session import Session
from transports.g711 import G711Codec
from transports.rtp.call import MediaStats, RtpCall
from transports.rtp.dtmf import DtmfSender
from transports.rtp.jitterbuffer import JitterBuffer

log = logging.getLogger("voxline.rtp")


class RtpMediaStream(asyncio.DatagramProtocol):
    """One call's RTP: ``open`` binds the socket; ``start`` begins sending to ``remote``."""

    def __init__(
        self,
        session: Session,
        codec: G711Codec,
        remote: tuple[str, int],
        dtmf_payload_type: int | None = 101,
        send_silence: bool = True,
        jitter_depth: int = 4,
    ) -> None:
        self.session = session
        self.remote = remote
        self.call = RtpCall(session, codec, dtmf_payload_type, send_silence, jitter_depth,
                            remote=remote)
        self.started_ns = 0  # when sending began (the call was ACKed); 0: not yet
        self._transport: asyncio.DatagramTransport | None = None
        self._sender: asyncio.Task[None] | None = None
        # digits being pressed and who waits for them (``send_dtmf``)
        self._dtmf_waiters: list[tuple[DtmfSender, asyncio.Future[None]]] = []
        self.closed = False

    @property
    def stats(self) -> MediaStats:
        return self.call.stats

    @property
    def jitter(self) -> JitterBuffer:
        return self.call.jitter

    @property
    def pacer(self) -> Pacer:
        return self.call.pacer

    @property
    def echo_payloads(self) -> list[bytes] | None:
        return self.call.echo_payloads

    @echo_payloads.setter
    def echo_payloads(self, payloads: list[bytes] | None) -> None:
        self.call.echo_payloads = payloads

    # --- socket ------------------------------------------------------------------------------
    async def open(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host, port))
        self._transport = transport  # type: ignore[assignment]
        return transport.get_extra_info("sockname")[:2]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def error_received(self, exc: Exception) -> None:  # ICMP port unreachable and friends
        log.debug("rtp socket error: %s", exc)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.call.receive(data, time.monotonic_ns(), addr)

    def retarget(self, remote: tuple[str, int]) -> None:
        """The caller's media moved (a re-INVITE): listen to and send to ``remote`` now."""
        self.remote = remote
        self.call.retarget(remote)

    @property
    def failed(self) -> BaseException | None:
        """What ended the sender task, when something other than :meth:`close` did."""
        sender = self._sender
        if sender is None or not sender.done() or sender.cancelled():
            return None
        return sender.exception()

    def silent_ns(self, now_ns: int) -> int:
        """How long the caller has sent us nothing (since sending began, when it never has);
        0 before the call is started."""
        if not self.started_ns:
            return 0
        return now_ns - max(self.started_ns, self.call.last_packet_ns)

    # --- sending -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._sender is None:
            self.started_ns = time.monotonic_ns()
            self._sender = asyncio.get_running_loop().create_task(self._send_loop())

    async def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> None:
        """Press ``digits`` (see :meth:`RtpCall.send_dtmf`) and return once the last one's end
        packets are sent; raises :class:`~agent.control.NotSupported` when the call has no
        telephone-event, ``ValueError`` for a bad digit or length, and
        :class:`~agent.control.CallControlError` when the call ends first. Cancelled, it ends
        the digit being played properly and presses no more."""
        if self.closed:
            raise CallControlError("the call has ended")
        sender = self.call.send_dtmf(digits, duration_ms, gap_ms)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._dtmf_waiters.append((sender, done))
        try:
            await done
        except asyncio.CancelledError:
            sender.stop()
            raise
        finally:
            self._dtmf_waiters = [(s, f) for s, f in self._dtmf_waiters if f is not done]

    def _dtmf_settled(self) -> None:
        for sender, done in self._dtmf_waiters:
            if sender.done and not done.done():
                done.set_result(None)

    async def _send_loop(self) -> None:
        call, stats = self.call, self.call.stats
        while True:
            packets = call.tick(time.monotonic_ns())
            if self._dtmf_waiters:
                self._dtmf_settled()
            transport = self._transport
            if transport is not None and not transport.is_closing():
                target = call.target or self.remote
                for data in packets:
                    try:
                        transport.sendto(data, target)
                    except (OSError, ValueError, TypeError) as err:
                        # an address the socket cannot use: the call goes on (and ends by
                        # BYE or the RTP timeout); only the first failure is logged
                        if not stats.send_errors:
                            log.warning("rtp: cannot send to %s: %s", target, err)
                        stats.send_errors += 1
            await asyncio.sleep(call.delay(time.monotonic_ns()))

    async def close(self) -> None:
        """Stop sending and close the socket; never raises (what the sender died of is
        logged), so the caller's session close always follows."""
        self.closed = True
        sender, self._sender = self._sender, None
        for _, done in self._dtmf_waiters:
            if not done.done():
                done.set_exception(CallControlError("the call ended before the digits were sent"))
        try:
            if sender is not None:
                sender.cancel()
                (result,) = await asyncio.gather(sender, return_exceptions=True)
                if isinstance(result, Exception):
                    log.error("rtp sender had failed: %r", result)
        finally:
            if self._transport is not None:
                self._transport.close()
                self._transport = None
