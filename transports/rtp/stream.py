"""The asyncio shell of one call's media: a UDP socket around the sans-I/O
:class:`~transports.rtp.call.RtpCall`. Datagrams go into the call as they arrive; a sender task
sleeps until the call's next packet time and sends what its ``tick`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from agent.pacer import Pacer
from agent.session import Session
from transports.g711 import G711Codec
from transports.rtp.call import MediaStats, RtpCall
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
        self.call = RtpCall(session, codec, dtmf_payload_type, send_silence, jitter_depth)
        self._transport: asyncio.DatagramTransport | None = None
        self._sender: asyncio.Task[None] | None = None

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
        self.call.receive(data, time.monotonic_ns())

    # --- sending -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send_loop())

    async def _send_loop(self) -> None:
        call = self.call
        while True:
            packets = call.tick(time.monotonic_ns())
            transport = self._transport
            if transport is not None and not transport.is_closing():
                for data in packets:
                    transport.sendto(data, self.remote)
            await asyncio.sleep(call.delay(time.monotonic_ns()))

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
