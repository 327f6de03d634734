"""The browser server operated: ``/metrics`` of a live server during a call, parsed with
prometheus-client's own parser (span histograms from the call's traced turns, calls active,
refusals, the event loop's lag); ``/healthz`` and ``/readyz``; and the drain — a live WebSocket
call goes on and ends normally while a new call is refused with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
from prom_text import samples

from agent import observe
from agent.metrics import Metrics
from agent.ops import drain
from transports.server import VoiceServer

FRAME = np.full(320, 1000, np.int16)


async def _turns(ws: aiohttp.ClientWebSocketResponse, n: int) -> None:
    """Send caller audio until ``n`` traced turns came back."""
    seen = 0
    async with asyncio.timeout(10):
        while seen < n:
            for _ in range(10):
                await ws.send_bytes(FRAME.tobytes())
            while True:
                msg = await ws.receive(timeout=5)
                if msg.type is aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "trace":
                    seen += 1
                    break


async def _until_closed(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    """What the server still sends after the caller's hangup, read up to its close (which the
    client then answers, as a browser does): the close message. A client that stops reading
    leaves the server waiting out the close handshake with the call still listed."""
    async with asyncio.timeout(5):
        while True:
            msg = await ws.receive()
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                            aiohttp.WSMsgType.CLOSED):
                return msg


@contextlib.asynccontextmanager
async def served(new_session) -> AsyncIterator[tuple[VoiceServer, Metrics, str]]:
    """A VoiceServer operated as ``voxline serve`` runs it — its metrics, the budget log, the
    loop's watchdog — and its base URL; all stopped and unregistered at the end."""
    metrics = Metrics("serve")
    server = VoiceServer(new_session, port=0, max_calls=2, metrics=metrics.render)
    metrics.add_source(server.metric_samples)
    unwatch = [observe.watch(metrics), observe.watch(observe.BudgetLog())]
    watchdog = observe.LoopWatchdog(on_lag=metrics.observe_lag, interval_s=0.02).start()
    await server.start()
    try:
        yield server, metrics, f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()
        await watchdog.stop()
        for fn in unwatch:
            fn()


def test_metrics_of_a_live_call_parse_and_count_its_turns(new_session, caplog):
    async def main():
        async with served(new_session) as (server, _, base), aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{base}/ws")
            await _turns(ws, 3)
            text = await (await http.get(f"{base}/metrics")).text()
            during = samples(text)
            async with http.get(f"{base}/readyz") as r:
                ready = (r.status, await r.json())
            await ws.send_str(json.dumps({"type": "hangup"}))
            await _until_closed(ws)
            async with asyncio.timeout(5):
                while server.calls:
                    await asyncio.sleep(0.01)
            after = samples(await (await http.get(f"{base}/metrics")).text())
        return text, during, ready, after

    with caplog.at_level(logging.WARNING, "voxline.budget"):
        text, during, ready, after = asyncio.run(main())
    assert "# TYPE voxline_span_seconds histogram" in text
    assert during[("voxline_calls_active", ())] == 1
    assert during[("voxline_calls_admitted", ())] == 1
    assert during[("voxline_calls_total", ())] == 1
    v2v = ("voxline_span_seconds_count", (("span", "voice_to_voice"),))
    assert during[v2v] == 3  # one per traced turn of the tone agent
    assert during[("voxline_turns_total", (("complete", "true"), ("kind", "turn")))] == 3
    # the tone agent's turns take ~0 ms against their 800 ms budget: none over
    assert ("voxline_budget_violations_total", (("span", "voice_to_voice"),)) not in during
    assert not [r for r in caplog.records if r.name == "voxline.budget"]
    assert during[("voxline_event_loop_lag_seconds_count", ())] > 0
    assert during[("voxline_calls_refused_total", (("reason", "limit"),))] == 0
    assert ready == (200, {"ready": True, "reasons": []})
    assert after[("voxline_calls_active", ())] == 0
    assert after[("voxline_calls_ended_total", (("reason", "hangup"),))] == 1
    # no label names a call: no label value is a session id
    assert not any(value.startswith("call-") for _, labels in after for _, value in labels)


def test_a_span_over_budget_is_counted_and_logged_as_json(new_session, caplog):
    def tight():  # the tone agent's session with a budget no turn can meet
        s = new_session()
        s.trace.budgets["voice_to_voice"] = -1.0
        return s

    async def main():
        async with served(tight) as (_, _, base), aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{base}/ws")
            await _turns(ws, 2)
            got = samples(await (await http.get(f"{base}/metrics")).text())
            await ws.close()
        return got

    with caplog.at_level(logging.WARNING, "voxline.budget"):
        got = asyncio.run(main())
    assert got[("voxline_budget_violations_total", (("span", "voice_to_voice"),))] == 2
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voxline.budget"]
    assert len(logged) == 2 and logged[0]["event"] == "budget_violation"
    assert logged[0]["span"] == "voice_to_voice" and logged[0]["budget_ms"] == -1.0
    assert logged[0]["session"].startswith("call-") and [x["turn"] for x in logged] == [1, 2]


def test_a_drain_refuses_new_calls_and_lets_the_live_one_end_normally(new_session):
    async def main():
        async with served(new_session) as (server, metrics, base), \
                aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{base}/ws")
            await _turns(ws, 1)
            drained = asyncio.ensure_future(drain(server, timeout_s=30))
            await asyncio.sleep(0.1)
            assert not drained.done()  # the live call holds the drain open
            async with http.get(f"{base}/readyz") as r:
                ready = (r.status, await r.json())
            async with http.get(f"{base}/ws") as r:  # a new call (a plain GET: 503 first)
                refused = (r.status, await r.text())
            await _turns(ws, 2)  # the live call goes on: two more answered turns
            await ws.send_str(json.dumps({"type": "hangup"}))
            close = await _until_closed(ws)
            left = await asyncio.wait_for(drained, 10)
            got = samples(metrics.render()[0].decode())
        return ready, refused, close, left, got

    ready, refused, close, left, got = asyncio.run(main())
    assert ready[0] == 503 and "draining: the server is shutting down" in ready[1]["reasons"]
    assert refused[0] == 503 and "shutting down" in refused[1]
    assert close.type is aiohttp.WSMsgType.CLOSE and close.data == 1000  # a normal end
    assert left == 0
    assert got[("voxline_calls_refused_total", (("reason", "draining"),))] == 1
    assert got[("voxline_draining", ())] == 1
    assert got[("voxline_calls_ended_total", (("reason", "hangup"),))] == 1
