"""An idle caller over real transports on 127.0.0.1: the agent's re-prompt and goodbye come back
as audio, then the agent ends the call cleanly with the reason — a ``hangup`` event and a close
with code 1000 (WebSocket), a ``hangup`` event on the data channel and the peer connection
closed (WebRTC), a BYE with a Reason header (SIP), a normal close once Twilio has played the
audio (Twilio media streams)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import numpy as np
from idle_agent import IDLE, idle_session, tone_seconds
from sip_requests import SDP_OFFER, request

from agent.frames import FRAME_SAMPLES, SAMPLE_RATE
from agent.session import Session
from transports.g711 import ulaw_decode, ulaw_encode
from transports.rtp.packet import Packetizer, parse_rtp
from transports.server import VoiceServer
from transports.sip.message import parse_sip
from transports.sip.server import SipServer

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
# the agent's two utterances, in 20 ms frames (one WebSocket frame, one RTP or Twilio packet)
SPOKEN_FRAMES = round((tone_seconds(IDLE.idle_reprompt) + tone_seconds(IDLE.idle_goodbye)) / FRAME_S)


class Sessions:
    def __init__(self) -> None:
        self.made: list[Session] = []

    def __call__(self, *start) -> Session:
        self.made.append(idle_session())
        return self.made[-1]


async def _wait(pred, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


def _loud(pcm: np.ndarray) -> bool:
    return bool(np.abs(pcm.astype(np.int32)).max() > 1000)


def test_websocket_idle_call_hears_reprompt_and_goodbye_then_a_normal_close() -> None:
    async def main() -> None:
        made = Sessions()
        server = VoiceServer(made, port=0)
        await server.start()
        got: list[tuple[str, object]] = []  # ("audio", loud?) | ("event", event)
        try:
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")

                async def caller_says_nothing() -> None:
                    silence = np.zeros(FRAME_SAMPLES, np.int16).tobytes()
                    while True:
                        await ws.send_bytes(silence)
                        await asyncio.sleep(FRAME_S)

                sender = asyncio.create_task(caller_says_nothing())
                async with asyncio.timeout(8):
                    while True:
                        msg = await ws.receive()
                        if msg.type is aiohttp.WSMsgType.BINARY:
                            got.append(("audio", _loud(np.frombuffer(msg.data, "<i2"))))
                        elif msg.type is aiohttp.WSMsgType.TEXT:
                            got.append(("event", json.loads(msg.data)))
                        else:
                            break
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
                assert msg.type is aiohttp.WSMsgType.CLOSE
                assert (msg.data, msg.extra) == (1000, "idle")
            await _wait(lambda: not server.calls)
        finally:
            await server.stop()
        said = [e["text"] for k, e in got if k == "event" and e["type"] == "agent_say"]
        assert said == [IDLE.idle_reprompt, IDLE.idle_goodbye]
        loud = sum(1 for k, v in got if k == "audio" and v)
        assert loud == SPOKEN_FRAMES  # every frame of both utterances came back
        last_kind, last = got[-1]
        assert last_kind == "event" and last == {"type": "hangup", "reason": "idle"}
        session = made.made[0]
        assert session.closed and session.summary["reason"] == "idle"

    asyncio.run(main())


def test_sip_idle_call_hears_reprompt_and_goodbye_then_a_bye_with_the_reason() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        made = Sessions()
        server = SipServer(made, port=0, rtp_ports=(44000, 44100))
        host, port = await server.start()
        sip, rtp = _udp(), _udp()
        offer = SDP_OFFER.replace("m=audio 6000", f"m=audio {rtp.getsockname()[1]}")
        heard: list[tuple[float, bool]] = []  # (arrival, loud?) of each agent RTP packet
        try:
            sip.sendto(request("INVITE", body=offer), (host, port))
            answers = [parse_sip(await asyncio.wait_for(loop.sock_recv(sip, 65535), 5))
                       for _ in range(3)]
            ok = answers[-1]
            assert ok.status == 200
            media_port = int(ok.body.decode().split("m=audio ")[1].split()[0])
            sip.sendto(request("ACK", to_tag=ok.header("To").split("tag=")[1]), (host, port))
            # one packet of silence, then the caller's phone goes quiet on the wire (the
            # server fills the silence, so the media clock runs on)
            packet = Packetizer(0).packet(ulaw_encode(np.zeros(160, np.int16)), marker=True)
            rtp.sendto(packet.to_bytes(), ("127.0.0.1", media_port))

            async def listen() -> None:
                while True:
                    pkt = parse_rtp(await loop.sock_recv(rtp, 2048))
                    heard.append((time.monotonic(), _loud(ulaw_decode(pkt.payload))))

            listener = asyncio.create_task(listen())
            bye = parse_sip(await asyncio.wait_for(loop.sock_recv(sip, 65535), 8))
            bye_at = time.monotonic()
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await _wait(lambda: server.reports)
        finally:
            sip.close()
            rtp.close()
            await server.stop()
        assert bye.method == "BYE" and bye.call_id == ok.call_id
        assert bye.header("Reason") == 'Q.850;cause=16;text="idle"'
        loud = [t for t, on in heard if on]
        assert abs(len(loud) - SPOKEN_FRAMES) <= 2  # both utterances (resampling smears edges)
        assert bye_at > loud[-1]  # the BYE came after the goodbye had gone out
        assert server.reports[0].reason == "idle" and made.made[0].summary["reason"] == "idle"

    asyncio.run(main())


def test_twilio_idle_stream_is_closed_normally_once_twilio_played_the_goodbye() -> None:
    from websockets.asyncio.client import connect

    from transports.twilio.caller import TwilioCaller
    from transports.twilio.server import TwilioServer

    async def main() -> None:
        made = Sessions()
        server = TwilioServer(made, port=0)
        host, port = await server.start()
        try:
            async with connect(f"ws://{host}:{port}/twilio/media") as ws:
                log = await TwilioCaller().run(ws, np.zeros(160, np.int16), tail_s=8)
            await _wait(lambda: server.reports)
        finally:
            await server.stop()
        assert (log.close_code, log.close_reason) == (1000, "idle")
        assert abs(sum(_loud(c) for c in log.agent_chunks) - SPOKEN_FRAMES) <= 2
        assert log.marks_sent and set(log.marks_echoed) == set(log.marks_sent)  # all played
        report = server.reports[0]
        assert report.reason == "idle" and made.made[0].summary["reason"] == "idle"

    asyncio.run(main())


def test_webrtc_idle_call_gets_a_hangup_event_on_the_data_channel_then_closes() -> None:
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError
    from test_webrtc_loopback import SineTrack, _offer

    from transports.webrtc.ice import rtc_configuration, use_loopback_ice
    from transports.webrtc.inbound import InboundAudio
    from transports.webrtc.peer import HANGUP_LINGER_S

    async def main() -> None:
        use_loopback_ice()
        made = Sessions()
        server = VoiceServer(made, port=0)
        await server.start()
        pc = RTCPeerConnection(rtc_configuration())
        events: list[dict] = []
        loud_at: list[float] = []
        channel = pc.createDataChannel("events")
        channel.on("message", lambda m: events.append(json.loads(m)))
        pc.addTrack(SineTrack())  # the caller's line is live; no VAD here, so it counts as silence

        async def listen(track) -> None:
            inbound = InboundAudio()
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                loud_at.extend(time.monotonic() for pcm in inbound.feed(frame) if _loud(pcm))

        pc.on("track", lambda track: asyncio.ensure_future(listen(track)))
        try:
            status, answer = await _offer(server, pc)
            assert status == 200
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
            await _wait(lambda: any(e["type"] == "hangup" for e in events), timeout=10)
            hangup_at = time.monotonic()
            await _wait(lambda: not server.calls)
        finally:
            await pc.close()
            await server.stop()
        said = [e["text"] for e in events if e["type"] == "agent_say"]
        assert said == [IDLE.idle_reprompt, IDLE.idle_goodbye]
        assert events[-1] == {"type": "hangup", "reason": "idle"}
        assert abs(len(loud_at) - SPOKEN_FRAMES) <= 4  # both utterances, through Opus
        assert loud_at[-1] - hangup_at < HANGUP_LINGER_S  # all of it before the call closed
        assert made.made[0].closed and made.made[0].summary["reason"] == "idle"

    asyncio.run(main())


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s
