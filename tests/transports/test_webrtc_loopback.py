"""The WebRTC transport against an aiortc client in the same process (no browser): signalling,
Opus audio both ways, events on the data channel, hang-up and teardown."""

import asyncio
import fractions
import json

import aiohttp
import av
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from transports.server import VoiceServer
from transports.webrtc.ice import keep_loopback_candidates, rtc_configuration, use_loopback_ice
from transports.webrtc.inbound import InboundAudio


class SineTrack(MediaStreamTrack):
    """The caller: 300 Hz at amplitude 8000, 20 ms frames at 48 kHz, paced in real time."""

    kind = "audio"

    def __init__(self):
        super().__init__()
        self.pts = 0
        self.t0 = None

    async def recv(self):
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self.t0 is None:
            self.t0 = loop.time()
        await asyncio.sleep(max(0.0, self.t0 + self.pts / 48000 - loop.time()))
        t = (np.arange(960) + self.pts) / 48000
        pcm = (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = 48000, self.pts, fractions.Fraction(1, 48000)
        self.pts += 960
        return frame


async def _wait(pred, timeout=10.0):
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


async def _offer(server, pc) -> tuple[int, dict | None]:
    """Send ``pc``'s offer to the server's /offer: the status and the answer (if 200)."""
    await pc.setLocalDescription(await pc.createOffer())
    async with aiohttp.ClientSession() as http:
        r = await http.post(f"http://127.0.0.1:{server.port}/offer",
                            json={"sdp": pc.localDescription.sdp, "type": "offer"})
        return r.status, (await r.json() if r.status == 200 else None)


def test_webrtc_call_audio_both_ways_events_and_hangup(new_session, pool):
    async def main():
        use_loopback_ice()
        server = VoiceServer(new_session, port=0)
        await server.start()
        pc = RTCPeerConnection(rtc_configuration())
        events, heard, sizes = [], [], set()
        channel = pc.createDataChannel("events")
        channel.on("message", lambda m: events.append(json.loads(m)))
        pc.addTrack(SineTrack())

        async def listen(track):
            inbound = InboundAudio()
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                sizes.add(frame.samples)
                heard.extend(inbound.feed(frame))

        pc.on("track", lambda track: asyncio.ensure_future(listen(track)))
        status, answer = await _offer(server, pc)
        assert status == 200
        assert "a=candidate" in answer["sdp"]
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))

        await _wait(lambda: any(e["type"] == "trace" for e in events))
        assert events[0]["type"] == "ready" and events[0]["session"] == answer["session"]
        final = next(e for e in events if e["type"] == "transcript")
        assert int(final["text"].split()[1]) > 4000  # our sine reached the agent through Opus
        trace = next(e for e in events if e["type"] == "trace")
        assert trace["kind"] == "turn" and "transport_send" in trace["spans"]

        def agent_tone_heard():
            loud = [f for f in heard if np.abs(f.astype(np.int32)).max() > 3000]
            return len(loud) >= 5

        await _wait(agent_tone_heard)  # the agent's 440 Hz reached us through Opus
        assert len(server.calls) == 1 and len(pool.free) == 63
        # the agent's audio left in low-delay Opus, one 20-ms packet at a time
        assert next(iter(server.calls.values())).low_delay_opus and sizes == {960}
        session = new_session.sessions[0]

        channel.send(json.dumps({"type": "hangup"}))
        await _wait(lambda: not server.calls)
        assert session.closed and not session.ctx.tasks and len(pool.free) == 64
        await pc.close()
        await server.stop()

    asyncio.run(main())


def test_a_peer_that_vanishes_frees_its_session(new_session, pool):
    async def main():
        use_loopback_ice()
        server = VoiceServer(new_session, port=0)
        await server.start()
        pc = RTCPeerConnection(rtc_configuration())
        pc.createDataChannel("events")
        pc.addTrack(SineTrack())
        _, answer = await _offer(server, pc)
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        await _wait(lambda: new_session.sessions[0].agent.frames > 10)
        await pc.close()  # no hang-up message: the peer is just gone
        await _wait(lambda: not server.calls, timeout=20)
        assert len(pool.free) == 64 and new_session.sessions[0].closed
        await server.stop()

    asyncio.run(main())


def test_bad_offers_are_refused_and_leave_nothing_behind(new_session, pool):
    async def main():
        server = VoiceServer(new_session, port=0)
        await server.start()
        url = f"http://127.0.0.1:{server.port}/offer"
        async with aiohttp.ClientSession() as http:
            json_type = {"Content-Type": "application/json"}
            deep = b'{"sdp": ' + b"[" * 100_000 + b"]" * 100_000 + b', "type": "offer"}'
            for body in [b"{nope", b'{"type": "offer"}', b'{"sdp": "v=0", "type": "answer"}',
                         deep[:60_000], b'{"sdp": NaN, "type": "offer"}']:
                r = await http.post(url, data=body, headers=json_type)
                assert r.status == 400 and "offer" in await r.text()
            r = await http.post(url, json={"sdp": "this is not sdp", "type": "offer"})
            assert r.status == 400 and "cannot answer" in await r.text()
            r = await http.post(url, data=b"x" * (1 << 20), headers=json_type)
            assert r.status == 413
            # a CORS-simple request (text/plain skips the browser's preflight): refused
            r = await http.post(url, data=b'{"sdp": "v=0", "type": "offer"}',
                                headers={"Content-Type": "text/plain"})
            assert r.status == 415 and "application/json" in await r.text()
        assert not server.calls and len(pool.free) == 64
        await server.stop()

    asyncio.run(main())


def test_only_loopback_candidates_are_kept():
    sdp = "\r\n".join([
        "v=0",
        "a=candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host",
        "a=candidate:2 1 udp 2122194687 10.0.0.7 50001 typ host",
        "a=candidate:3 1 udp 2122194687 abcd.local 50002 typ host",
        "a=end-of-candidates",
    ])
    kept = keep_loopback_candidates(sdp).split("\r\n")
    assert kept == ["v=0", "a=candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host",
                    "a=end-of-candidates"]


def test_inbound_audio_is_cut_into_whole_20ms_frames_at_16k():
    inbound = InboundAudio()
    out, per_packet = [], []
    for k in range(10):
        stereo = np.full((1, 1920), 1000, np.int16)  # packed s16 stereo, 960 samples per channel
        frame = av.AudioFrame.from_ndarray(stereo, format="s16", layout="stereo")
        frame.sample_rate, frame.pts = 48000, k * 960
        got = list(inbound.feed(frame))
        per_packet.append(len(got))
        out.extend(got)
    assert all(len(f) == 320 and f.dtype == np.int16 for f in out)
    # Every packet yields its frame at once: no sample waits for the next packet.
    assert per_packet == [1] * 10 and inbound.held == 0
    assert abs(int(out[-1][160]) - 1000) < 50


def test_a_browser_that_never_connects_is_let_go(new_session, pool, monkeypatch):
    import transports.webrtc.peer as peer

    monkeypatch.setattr(peer, "CONNECT_TIMEOUT_S", 0.5)

    async def main():
        use_loopback_ice()
        server = VoiceServer(new_session, port=0)
        await server.start()
        pc = RTCPeerConnection(rtc_configuration())
        pc.createDataChannel("events")
        pc.addTrack(SineTrack())
        status, _ = await _offer(server, pc)
        assert status == 200  # ... but the answer is never applied
        assert len(server.calls) == 1 and len(pool.free) == 63
        await _wait(lambda: not server.calls)
        assert len(pool.free) == 64 and new_session.sessions[0].closed
        await pc.close()
        await server.stop()

    asyncio.run(main())


def test_audio_receivers_release_each_packet_as_it_arrives():
    from aiortc.jitterbuffer import JitterBuffer
    from aiortc.rtp import RtpPacket

    from transports.webrtc.peer import AudioJitterBuffer, shorten_jitter_buffers

    async def main():
        caller, answerer = RTCPeerConnection(), RTCPeerConnection()
        caller.addTrack(SineTrack())
        await caller.setLocalDescription(await caller.createOffer())
        await answerer.setRemoteDescription(caller.localDescription)
        (transceiver,) = answerer.getTransceivers()
        before = transceiver.receiver._RTCRtpReceiver__jitter_buffer
        assert shorten_jitter_buffers(answerer)
        after = transceiver.receiver._RTCRtpReceiver__jitter_buffer
        await caller.close()
        await answerer.close()
        return before, after

    before, after = asyncio.run(main())
    assert type(before) is JitterBuffer and before._prefetch == 4  # aiortc's: 80 ms
    assert isinstance(after, AudioJitterBuffer) and after.capacity == before.capacity

    def packet(seq: int) -> RtpPacket:
        p = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * 960)
        p._data = bytes([seq % 256])
        return p

    buf = AudioJitterBuffer(capacity=16)
    got = [buf.add(packet(s))[1] for s in (100, 101, 102)]
    assert [f.data for f in got] == [b"d", b"e", b"f"]  # each at once, in order
    assert buf.add(packet(104))[1] is None  # 103 is missing: 104 waits for it a little
    assert buf.add(packet(105))[1].data == b"h"  # two waiting: 103 is lost, 104 goes
    assert buf.add(packet(106))[1].data == b"i"
    assert buf.add(packet(103))[1] is None  # too late: dropped, as aiortc drops misordered ones
    assert buf.add(packet(107))[1].data == b"j"


class FloodTrack(SineTrack):
    """A sender that does not pace: audio as fast as the sender's loop takes it."""

    async def recv(self):
        self.t0 = asyncio.get_running_loop().time() - self.pts / 48000  # never ahead: no wait
        return await super().recv()


def test_a_webrtc_sender_faster_than_real_time_is_held_to_it(new_session, pool):
    async def main():
        use_loopback_ice()
        server = VoiceServer(new_session, port=0)
        await server.start()
        pc = RTCPeerConnection(rtc_configuration())
        pc.createDataChannel("events")
        pc.addTrack(FloodTrack())
        status, answer = await _offer(server, pc)
        assert status == 200
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        call = next(iter(server.calls.values()))
        await _wait(lambda: call.dropped_inbound > 200, timeout=20)
        elapsed = loop.time() - t0
        assert call.frames_in <= 100 + 1.25 * 50 * elapsed + 5
        await pc.close()
        await _wait(lambda: not server.calls)
        assert len(pool.free) == 64
        # /metrics keeps the ended call's drops
        dropped = {dict(x.labels)["transport"]: x.value for x in server.metric_samples()
                   if x.name == "voxline_frames_dropped" and ("direction", "in") in x.labels}
        assert dropped["webrtc"] == call.dropped_inbound > 200
        await server.stop()

    asyncio.run(main())
