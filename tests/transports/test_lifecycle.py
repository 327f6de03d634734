"""A call's session is closed on every path, by one helper that every transport uses: here a
session whose start fails (a stage raises after another took a slot and spawned a task) is
closed — slot back, task cancelled — on each transport, and the server serves the next call."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import numpy as np
import pytest
from sip_requests import SDP_OFFER, request

from agent.frames import AudioIn, Direction, TTSAudio
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from transports.lifecycle import CallLifecycle
from transports.server import VoiceServer

FRAME = np.full(320, 1000, np.int16)


class HoldsASlot(Stage):
    """Takes a slot and spawns a task when it starts, gives both back when it stops, and
    repeats the caller's audio as the agent's."""

    name = "holds_a_slot"

    def __init__(self, free: list[int]) -> None:
        super().__init__()
        self.free = free
        self.slot: int | None = None
        self.task: asyncio.Task | None = None

    async def start(self, ctx) -> None:
        await super().start(ctx)
        self.slot = self.free.pop()
        self.task = ctx.spawn(asyncio.sleep(3600), name="holds-a-slot-idle")

    async def stop(self) -> None:
        if self.slot is not None:
            self.free.append(self.slot)
            self.slot = None

    def process(self, frame, direction) -> None:
        if isinstance(frame, AudioIn):
            self.push(TTSAudio(frame.pcm), Direction.DOWNSTREAM)
        else:
            self.push(frame, direction)


class FailsToStart(Stage):
    name = "fails_to_start"

    async def start(self, ctx) -> None:
        await super().start(ctx)
        raise RuntimeError("no GPU left for this call")


class Sessions:
    """A session factory whose first session fails to start; the later ones are fine."""

    def __init__(self) -> None:
        self.free = list(range(4))
        self.made: list[Session] = []
        self.holders: list[HoldsASlot] = []

    def __call__(self, *_: object) -> Session:
        holder = HoldsASlot(self.free)
        stages = [holder] if self.made else [holder, FailsToStart()]
        self.holders.append(holder)
        self.made.append(Session(Pipeline(stages)))
        return self.made[-1]

    def assert_first_closed(self) -> None:
        assert self.made[0].closed, "the session whose start failed was not closed"
        assert self.holders[0].slot is None and self.holders[0].task.done()
        assert not self.made[0].ctx.tasks


async def _wait(pred, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


# --- the helper ------------------------------------------------------------------------------
def test_a_block_that_raises_closes_with_error_and_a_cancelled_one_keeps_its_reason() -> None:
    async def main() -> None:
        made = Sessions()
        made()  # the failing one, not used here
        ok = made()
        with pytest.raises(ValueError):
            async with CallLifecycle(ok, reason="disconnect") as life:
                assert life.started and made.holders[1].slot is not None
                raise ValueError("a bug in the call")
        assert ok.closed and life.reason == "error" and made.holders[1].slot is None

        third = made()
        life = CallLifecycle(third, reason="disconnect")

        async def call() -> None:
            async with life:
                await asyncio.sleep(3600)

        task = asyncio.create_task(call())
        await _wait(lambda: life.started)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert third.closed and life.reason == "disconnect"
        assert await life.close("later") == third.summary and life.reason == "disconnect"

    asyncio.run(main())


def test_a_start_that_fails_has_closed_the_session() -> None:
    async def main() -> None:
        made = Sessions()
        life = CallLifecycle(made())
        with pytest.raises(RuntimeError, match="no GPU"):
            await life.start()
        assert not life.started and life.reason == "error"
        made.assert_first_closed()
        assert sorted(made.free) == [0, 1, 2, 3]

    asyncio.run(main())


# --- per transport ---------------------------------------------------------------------------
def test_websocket_call_whose_start_fails_is_closed_and_told_why() -> None:
    async def main() -> None:
        made = Sessions()
        server = VoiceServer(made, port=0)
        await server.start()
        url = f"http://127.0.0.1:{server.port}/ws"
        try:
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(url)
                msg = await ws.receive(timeout=5)
                event = json.loads(msg.data)
                assert event["type"] == "error" and event["fatal"]
                assert "cannot start a call: no GPU" in event["message"]
                assert (await ws.receive(timeout=5)).type is aiohttp.WSMsgType.CLOSE
                await _wait(lambda: not server.calls)
                made.assert_first_closed()
                assert server.admission.active == 0

                ws = await http.ws_connect(url)  # the server serves the next call
                assert json.loads((await ws.receive(timeout=5)).data)["type"] == "ready"
                await ws.send_bytes(FRAME.tobytes())
                while (msg := await ws.receive(timeout=5)).type is not aiohttp.WSMsgType.BINARY:
                    pass
                assert len(msg.data) == 640
                await ws.close()
                await _wait(lambda: not server.calls)
        finally:
            await server.stop()
        assert made.made[1].closed and sorted(made.free) == [0, 1, 2, 3]

    asyncio.run(main())


def test_twilio_stream_whose_start_fails_is_closed_and_the_server_goes_on() -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from transports.twilio.caller import TwilioCaller
    from transports.twilio.messages import Connected, Start
    from transports.twilio.server import TwilioServer

    async def main() -> None:
        made = Sessions()
        server = TwilioServer(made, port=0)
        host, port = await server.start()
        url = f"ws://{host}:{port}/twilio/media"
        try:
            async with connect(url) as ws:
                await ws.send(Connected().to_json())
                await ws.send(Start("MZ1", "CA1").to_json())
                with pytest.raises(ConnectionClosed):
                    async with asyncio.timeout(5):
                        while True:
                            await ws.recv()
            await _wait(lambda: server.active == 0)
            made.assert_first_closed()
            assert not server.reports

            tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(4000) / 8000)).astype(np.int16)
            async with connect(url) as ws:
                log = await TwilioCaller().run(ws, tone, tail_s=0.3)
            await _wait(lambda: server.reports)
        finally:
            await server.stop()
        assert server.reports[0].reason == "stop" and len(log.agent_audio) > 2000
        assert made.made[1].closed and sorted(made.free) == [0, 1, 2, 3]

    asyncio.run(main())


def test_sip_call_whose_start_fails_is_refused_and_closed_and_the_next_is_answered() -> None:
    from transports.sip.message import parse_sip
    from transports.sip.server import SipServer

    async def main() -> None:
        loop = asyncio.get_running_loop()
        made = Sessions()
        server = SipServer(made, port=0, rtp_ports=(43000, 43100))
        host, port = await server.start()
        sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sip.bind(("127.0.0.1", 0))
        sip.setblocking(False)

        async def statuses(call_id: str) -> list[int]:
            sip.sendto(request("INVITE", call_id=call_id, body=SDP_OFFER), (host, port))
            got: list[int] = []
            while not got or got[-1] < 200:
                data = await asyncio.wait_for(loop.sock_recv(sip, 65535), 5)
                got.append(parse_sip(data).status)
            return got

        try:
            assert await statuses("fails@127.0.0.1") == [100, 180, 500]
            made.assert_first_closed()
            assert not server.calls
            assert await statuses("works@127.0.0.1") == [100, 180, 200]
            assert list(server.calls) == ["works@127.0.0.1"] and not made.made[1].closed
        finally:
            sip.close()
            await server.stop()
        assert made.made[1].closed and sorted(made.free) == [0, 1, 2, 3]

    asyncio.run(main())


def test_webrtc_call_whose_start_fails_is_closed_and_the_next_offer_is_answered() -> None:
    from aiortc import RTCPeerConnection

    from transports.webrtc.ice import rtc_configuration, use_loopback_ice

    async def main() -> None:
        use_loopback_ice()
        made = Sessions()
        server = VoiceServer(made, port=0)
        await server.start()
        url = f"http://127.0.0.1:{server.port}/offer"
        pc = RTCPeerConnection(rtc_configuration())
        try:
            async with aiohttp.ClientSession() as http:
                r = await http.post(url, json={"sdp": "v=0", "type": "offer"})
                assert r.status == 500 and "cannot start a call: no GPU" in await r.text()
                made.assert_first_closed()
                assert not server.calls and server.admission.active == 0

                pc.createDataChannel("events")
                pc.addTransceiver("audio")
                await pc.setLocalDescription(await pc.createOffer())
                r = await http.post(url, json={"sdp": pc.localDescription.sdp, "type": "offer"})
                assert r.status == 200 and "m=audio" in (await r.json())["sdp"]
                assert len(server.calls) == 1 and not made.made[1].closed
        finally:
            await pc.close()
            await server.stop()
        assert made.made[1].closed and sorted(made.free) == [0, 1, 2, 3]

    asyncio.run(main())
