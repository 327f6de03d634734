"""The WebSocket transport through the real server: calls, events, teardown, auth, bad input."""

import asyncio
import contextlib
import json

import aiohttp
import numpy as np
import pytest

from transports.server import VoiceServer

FRAME = np.full(320, 1000, np.int16)


async def _serve(new_session, **kw):
    server = VoiceServer(new_session, host=kw.pop("host", "127.0.0.1"), port=0, **kw)
    await server.start()
    return server


async def _collect(ws, until, timeout=5.0):
    """Read messages until ``until(events, audio_frames)`` holds; returns both."""
    events, audio = [], []
    async with asyncio.timeout(timeout):
        while not until(events, audio):
            msg = await ws.receive()
            if msg.type is aiohttp.WSMsgType.TEXT:
                events.append(json.loads(msg.data))
            elif msg.type is aiohttp.WSMsgType.BINARY:
                audio.append(np.frombuffer(msg.data, "<i2"))
            else:
                break
    return events, audio


async def _wait(pred, timeout=5.0):
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


def test_a_call_gets_transcript_agent_audio_and_trace_then_hangup_frees_it(new_session, pool):
    async def main():
        server = await _serve(new_session)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            ready, _ = await _collect(ws, lambda e, a: e)
            assert ready[0]["type"] == "ready" and ready[0]["sample_rate"] == 16000
            for _ in range(10):
                await ws.send_bytes(FRAME.tobytes())
            events, audio = await _collect(
                ws, lambda e, a: any(x["type"] == "trace" for x in e) and len(a) >= 15
            )
            finals = [e for e in events if e["type"] == "transcript" and e["final"]]
            assert finals[0]["text"] == "peak 1000"  # the server heard our audio intact
            assert all(len(a) == 320 for a in audio)
            tone = np.concatenate(audio)
            assert np.abs(tone).max() > 7000  # the agent's 440 Hz tone came back
            trace = next(e for e in events if e["type"] == "trace")
            assert trace["complete"] and "voice_to_voice" in trace["spans"]
            assert pool.free.__len__() == 63 and len(server.calls) == 1
            await ws.send_str(json.dumps({"type": "hangup"}))
            async with asyncio.timeout(5):  # the server closes the socket after a hang-up
                while (await ws.receive()).type not in (
                    aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED
                ):
                    pass
            await _wait(lambda: not server.calls)
        session = new_session.sessions[0]
        assert session.closed and len(pool.free) == 64
        assert session.agent.task.done() and not session.ctx.tasks
        await server.stop()

    asyncio.run(main())


def test_a_vanished_client_mid_turn_closes_its_session_and_others_go_on(new_session, pool):
    async def main():
        server = await _serve(new_session)
        async with aiohttp.ClientSession() as http:
            a = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            b = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            await _wait(lambda: len(server.calls) == 2)
            for _ in range(10):
                await a.send_bytes(FRAME.tobytes())
            await _collect(a, lambda e, au: len(au) >= 2)  # agent audio is flowing: mid-turn
            await a.close()
            await _wait(lambda: len(server.calls) == 1)
            sa = new_session.sessions[0]
            assert sa.closed and not sa.ctx.tasks and len(pool.free) == 63
            for _ in range(10):
                await b.send_bytes(FRAME.tobytes())
            events, _ = await _collect(b, lambda e, au: any(x["type"] == "trace" for x in e))
            assert any(e["type"] == "transcript" for e in events)
            await b.close()
            await _wait(lambda: not server.calls)
        assert len(pool.free) == 64 and server.served == 2
        await server.stop()

    asyncio.run(main())


def test_many_concurrent_calls_each_have_their_own_session(new_session, pool):
    async def main():
        server = await _serve(new_session)
        n = 20
        async with aiohttp.ClientSession() as http:
            conns = [await http.ws_connect(f"http://127.0.0.1:{server.port}/ws") for _ in range(n)]
            for i, ws in enumerate(conns):
                for _ in range(10):
                    await ws.send_bytes(np.full(320, 100 + i, np.int16).tobytes())
            results = await asyncio.gather(*(
                _collect(ws, lambda e, a: any(x["type"] == "transcript" for x in e)) for ws in conns
            ))
            for i, (events, _) in enumerate(results):
                text = next(e["text"] for e in events if e["type"] == "transcript")
                assert text == f"peak {100 + i}"  # nobody got another caller's audio
            assert len({s.id for s in new_session.sessions}) == n
            for ws in conns:
                await ws.close()
            await _wait(lambda: not server.calls)
        assert len(pool.free) == 64
        await server.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    "bad, words",
    [
        ("{oops", "not valid JSON"),
        ('{"type": "launch"}', "unknown event type"),
        (b"\1\2\3", "3 bytes"),
    ],
)
def test_bad_messages_get_an_error_event_and_the_call_goes_on(new_session, bad, words):
    async def main():
        server = await _serve(new_session)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            await (ws.send_str(bad) if isinstance(bad, str) else ws.send_bytes(bad))
            await ws.send_str(json.dumps({"type": "ping", "t": 42}))
            events, _ = await _collect(ws, lambda e, a: any(x["type"] == "pong" for x in e))
            err = next(e for e in events if e["type"] == "error")
            assert words in err["message"] and err["stage"] == "transport"
            assert next(e for e in events if e["type"] == "pong")["t"] == 42
            await ws.close()
        await server.stop()

    asyncio.run(main())


def test_a_huge_frame_closes_that_call_with_a_reason_and_the_server_stays_up(new_session, pool):
    async def main():
        server = await _serve(new_session)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            with contextlib.suppress(ConnectionError):  # the server may cut us off mid-send
                await ws.send_bytes(b"\0" * (1 << 20))
            msg = await ws.receive(timeout=5)
            while msg.type is aiohttp.WSMsgType.TEXT:
                msg = await ws.receive(timeout=5)
            assert msg.type is aiohttp.WSMsgType.CLOSE
            assert msg.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
            await _wait(lambda: not server.calls)
            assert len(pool.free) == 64
            ok = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            events, _ = await _collect(ok, lambda e, a: e)
            assert events[0]["type"] == "ready"
            await ok.close()
        await server.stop()

    asyncio.run(main())


def test_garbage_flood_is_cut_off(new_session):
    async def main():
        server = await _serve(new_session)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            for _ in range(80):
                await ws.send_bytes(b"\1")
            async with asyncio.timeout(5):
                while (msg := await ws.receive()).type is not aiohttp.WSMsgType.CLOSE:
                    pass
            assert msg.data == aiohttp.WSCloseCode.POLICY_VIOLATION
            assert msg.extra == "too many bad messages"
            await _wait(lambda: not server.calls)
        await server.stop()

    asyncio.run(main())


def test_off_loopback_a_token_is_required_and_accepted(new_session):
    async def main():
        # bound to all interfaces, reached over loopback: the token rule follows the bind address
        server = await _serve(new_session, host="0.0.0.0", token="s3cret")
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as http:
            for url, headers in [(f"{base}/ws", {}), (f"{base}/ws?token=wrong", {})]:
                with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                    await http.ws_connect(url, headers=headers)
                assert exc.value.status == 401
            r = await http.post(f"{base}/offer", json={"sdp": "v=0", "type": "offer"})
            assert r.status == 401
            assert not new_session.sessions  # nothing was started for a refused call
            for url, headers in [(f"{base}/ws?token=s3cret", {}),
                                 (f"{base}/ws", {"X-Voxline-Token": "s3cret"}),
                                 (f"{base}/ws", {"Authorization": "Bearer s3cret"})]:
                ws = await http.ws_connect(url, headers=headers)
                events, _ = await _collect(ws, lambda e, a: e)
                assert events[0]["type"] == "ready"
                await ws.close()
            page = await http.get(f"{base}/")
            assert page.status == 200 and "voxline" in await page.text()
        assert server.refused == 3
        await server.stop()

    asyncio.run(main())


def test_a_caller_who_hangs_up_and_stops_reading_frees_its_place_at_once(new_session, pool):
    # The server's close waits for the client's reply to its close frame (aiohttp: up to 10 s),
    # and this client never reads again: the place must not wait for that handshake.
    async def main():
        server = await _serve(new_session, max_calls=1)
        async with aiohttp.ClientSession() as http:
            a = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            for _ in range(10):
                await a.send_bytes(FRAME.tobytes())
            await _collect(a, lambda e, au: len(au) >= 2)  # the agent's tone is in flight
            await a.send_str(json.dumps({"type": "hangup"}))
            await _wait(lambda: not server.calls, timeout=3.0)
            assert new_session.sessions[0].closed and len(pool.free) == 64
            assert server.live_calls == 0
            b = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")  # not refused
            ready, _ = await _collect(b, lambda e, au: e)
            assert ready[0]["type"] == "ready"
            await b.close()
            await a.close()
        await server.stop()

    asyncio.run(main())


def test_loopback_needs_no_token_and_other_hosts_get_a_generated_one(new_session):
    assert not VoiceServer(new_session, host="127.0.0.1").auth.required
    generated = VoiceServer(new_session, host="0.0.0.0").auth
    assert generated.required and len(generated.token) >= 20
    assert "?token=" in VoiceServer(new_session, host="10.1.2.3").url


def test_calls_beyond_the_limit_are_refused_clearly(new_session):
    async def main():
        server = await _serve(new_session, max_calls=1)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            await _wait(lambda: len(server.calls) == 1)
            with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            assert exc.value.status == 503
            await ws.close()
            await _wait(lambda: not server.calls)
            ws = await http.ws_connect(f"http://127.0.0.1:{server.port}/ws")
            await ws.close()
        await server.stop()

    asyncio.run(main())
