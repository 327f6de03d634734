"""The browser server against a hostile client, each case a finding of the security review
reproduced through the real server: cross-site pages, DNS rebinding, the largest documented
message, audio pushed faster than real time, a client that goes quiet, slow-loris headers,
per-address limits, and SIGTERM-style stops with live calls of every kind."""

import asyncio
import json
import socket
import time

import aiohttp
import numpy as np
import pytest

from transports.server import VoiceServer
from transports.websocket import codec

FRAME = np.full(320, 1000, np.int16).tobytes()


async def _serve(new_session, **kw):
    server = VoiceServer(new_session, host=kw.pop("host", "127.0.0.1"), port=0, **kw)
    await server.start()
    return server


async def _events(ws, until, timeout=5.0):
    events = []
    async with asyncio.timeout(timeout):
        while not until(events):
            msg = await ws.receive()
            if msg.type is aiohttp.WSMsgType.TEXT:
                events.append(json.loads(msg.data))
            elif msg.type is not aiohttp.WSMsgType.BINARY:
                events.append({"type": "_closed", "code": msg.data, "extra": msg.extra})
                break
    return events


def _has(kind):
    return lambda events: any(e["type"] == kind for e in events)


def test_cross_site_pages_and_rebound_names_are_refused_before_a_call_starts(new_session):
    async def main():
        server = await _serve(new_session)
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as http:
            for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                            {"Host": "evil.example", "Origin": "http://evil.example"}):
                with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                    await http.ws_connect(f"{base}/ws", headers=headers)
                assert exc.value.status == 403
                r = await http.post(f"{base}/offer", json={"sdp": "v=0", "type": "offer"},
                                    headers=headers)
                assert r.status == 403
            assert not new_session.sessions  # no call was started for any of them
            # the server's own page (same origin) calls as before
            ws = await http.ws_connect(f"{base}/ws", headers={"Origin": base})
            assert (await _events(ws, _has("ready")))[0]["type"] == "ready"
            await ws.close()
        assert server.stats()["refused_by"]["origin"] == 4
        assert server.stats()["refused_by"]["host"] == 2
        await server.stop()

    asyncio.run(main())


def test_the_largest_documented_audio_message_is_taken_and_a_larger_one_explained(new_session):
    async def main():
        server = await _serve(new_session)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            await ws.send_bytes(FRAME * codec.MAX_AUDIO_FRAMES)  # 6,400 B: the documented most
            events = await _events(ws, lambda e: any(x["type"] == "transcript" for x in e))
            assert not [e for e in events if e["type"] in ("error", "_closed")]
            await ws.send_bytes(FRAME * (codec.MAX_AUDIO_FRAMES + 1))  # over it: told, not cut
            await ws.send_str(json.dumps({"type": "ping", "t": 1}))
            events = await _events(ws, _has("pong"))
            error = next(e for e in events if e["type"] == "error")
            assert "at most 6400 bytes" in error["message"]
            await ws.close()
        await server.stop()

    asyncio.run(main())


def test_audio_faster_than_real_time_is_dropped_and_other_calls_keep_their_pace(new_session):
    async def main():
        server = await _serve(new_session)
        url = f"http://127.0.0.1:{server.port}/ws"
        async with aiohttp.ClientSession() as http:
            flood, other = await http.ws_connect(url), await http.ws_connect(url)
            await _events(flood, _has("ready"))
            await _events(other, _has("ready"))
            chunk = FRAME * codec.MAX_AUDIO_FRAMES
            t0 = time.monotonic()
            for _ in range(300):  # 60 s of audio in well under a second
                await flood.send_bytes(chunk)
            sent_s = time.monotonic() - t0
            await flood.send_str(json.dumps({"type": "ping", "t": 7}))
            events = await _events(flood, _has("pong"), timeout=10)
            errors = [e for e in events if e["type"] == "error"]
            assert errors and "faster than real time" in errors[0]["message"]
            assert not errors[0]["fatal"]
            call = next(c for c in server.calls.values() if c.stats.dropped_inbound)
            # what was taken: the 2-s burst plus real time (25% slack) over the sending time
            assert call.stats.frames_in <= 100 + 1.25 * 50 * (time.monotonic() - t0) + 5
            assert call.stats.dropped_inbound >= 3000 - call.stats.frames_in - 5
            assert sent_s < 30
            # /metrics counts them while the call lives
            dropped = {dict(x.labels)["transport"]: x.value for x in server.metric_samples()
                       if x.name == "voxline_frames_dropped" and ("direction", "in") in x.labels}
            assert dropped["websocket"] >= call.stats.dropped_inbound and dropped["webrtc"] == 0
            # the other call is answered as usual
            await other.send_bytes(FRAME * 10)
            events = await _events(other, _has("transcript"))
            assert next(e for e in events if e["type"] == "transcript")["text"] == "peak 1000"
            await flood.close()
            await other.close()
        await server.stop()

    asyncio.run(main())


def test_a_client_that_sends_nothing_is_ended_and_its_slot_freed(new_session, pool):
    async def main():
        server = await _serve(new_session, idle_timeout_s=0.5)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws", heartbeat=None)
            events = await _events(ws, _has("_closed"), timeout=10)
            error = next(e for e in events if e["type"] == "error")
            assert "nothing received" in error["message"] and error["fatal"]
            assert events[-1]["code"] == aiohttp.WSCloseCode.POLICY_VIOLATION
        async with asyncio.timeout(5):
            while server.calls:
                await asyncio.sleep(0.01)
        assert len(pool.free) == 64 and new_session.sessions[0].closed
        await server.stop()

    asyncio.run(main())


def test_a_request_whose_headers_never_finish_is_cut_off(new_session):
    async def main():
        server = await _serve(new_session, header_timeout_s=1.0)
        loop = asyncio.get_running_loop()
        conns = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setblocking(False)
            await loop.sock_sendall(s, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            conns.append(s)
        t0 = time.monotonic()
        async with asyncio.timeout(10):
            for s in conns:
                while await loop.sock_recv(s, 4096):  # a 408/close or a bare close: then EOF
                    pass
        assert time.monotonic() - t0 < 8  # closed by the header deadline, not held for good
        for s in conns:
            s.close()
        async with aiohttp.ClientSession() as http:  # and the server serves on
            assert (await http.get(f"http://127.0.0.1:{server.port}/healthz")).status == 200
        await server.stop()

    asyncio.run(main())


def _outside_address():
    """This host's address on its first non-loopback interface, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_one_address_holds_at_most_its_share_of_calls(new_session):
    addr = _outside_address()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address to call from")

    async def main():
        server = await _serve(new_session, host="0.0.0.0", token="t", max_calls_per_client=2)
        url = f"http://{addr}:{server.port}/ws?token=t"
        async with aiohttp.ClientSession() as http:
            a, b = await http.ws_connect(url), await http.ws_connect(url)
            with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                await http.ws_connect(url)
            assert exc.value.status == 429
            # from loopback (a local proxy, say) the share does not apply
            extra = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws?token=t")
            await a.close()
            async with asyncio.timeout(5):
                while server.admission.per_client.get(addr, 0) > 1:
                    await asyncio.sleep(0.01)
            c = await http.ws_connect(url)
            for ws in (b, c, extra):
                await ws.close()
        assert server.stats()["refused_by"]["client_limit"] == 1
        await server.stop()

    asyncio.run(main())


def test_stop_ends_browser_and_twilio_calls_with_going_away(new_session):
    from websockets.asyncio.client import connect

    from transports.twilio.messages import Connected, Start
    from transports.twilio.mount import add_twilio_routes

    async def main():
        server = VoiceServer(new_session, port=0)
        add_twilio_routes(server.app, lambda start: new_session(), server.admission)
        await server.start()
        async with aiohttp.ClientSession() as http:
            browser = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            async with connect(f"ws://127.0.0.1:{server.port}/twilio/media") as tw:
                await tw.send(Connected().to_json())
                await tw.send(Start("MZ1", "CA1", "AC" + "0" * 32, sequence=1).to_json())
                async with asyncio.timeout(5):
                    while server.admission.active < 2:
                        await asyncio.sleep(0.01)
                t0 = time.monotonic()
                await asyncio.wait_for(server.stop(), 10)
                assert time.monotonic() - t0 < 5
                events = await _events(browser, _has("_closed"))
                assert events[-1]["code"] == 1001
                async with asyncio.timeout(5):
                    while True:
                        try:
                            await tw.recv()
                        except Exception:
                            break
                assert tw.close_code == 1001
        assert all(s.closed for s in new_session.sessions)

    asyncio.run(main())


def test_a_twilio_stream_that_goes_quiet_is_ended(new_session, pool, monkeypatch):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    import transports.twilio.server as twilio_server
    from transports.twilio.messages import Connected, Start
    from transports.twilio.mount import add_twilio_routes

    monkeypatch.setattr(twilio_server, "IDLE_TIMEOUT_S", 0.5)

    async def main():
        server = VoiceServer(new_session, port=0)
        add_twilio_routes(server.app, lambda start: new_session(), server.admission)
        await server.start()
        async with connect(f"ws://127.0.0.1:{server.port}/twilio/media") as tw:
            await tw.send(Connected().to_json())
            await tw.send(Start("MZ1", "CA1", "AC" + "0" * 32, sequence=1).to_json())
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(10):
                    while True:
                        await tw.recv()
            assert tw.close_code == 1011 and tw.close_reason == "no media"
        async with asyncio.timeout(5):
            while server.admission.active:
                await asyncio.sleep(0.01)
        assert new_session.sessions[0].closed and len(pool.free) == 64
        await server.stop()

    asyncio.run(main())


def test_a_token_header_that_is_not_utf8_is_refused_not_a_server_error(new_session):
    async def main():
        server = await _serve(new_session, host="0.0.0.0", token="s3cret")
        loop = asyncio.get_running_loop()
        s = socket.create_connection(("127.0.0.1", server.port))
        s.setblocking(False)
        await loop.sock_sendall(s, b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"X-Voxline-Token: \xff\xfe\r\nConnection: close\r\n\r\n")
        reply = b""
        async with asyncio.timeout(5):
            while chunk := await loop.sock_recv(s, 4096):
                reply += chunk
        s.close()
        assert reply.startswith(b"HTTP/1.1 401"), reply[:80]
        await server.stop()

    asyncio.run(main())
