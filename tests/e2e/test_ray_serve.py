"""End to end on a local Ray cluster (loopback only): ``voxline serve --ray``'s application with
two voice replicas, real WebSocket calls playing real speech, placed by the ingress and served
straight by the replicas; a redeploy down to one replica, which drains each old replica while
its call goes on; autoscaling on active calls, up to a second replica and back down with a call
live (which replica Serve stops is its choice, so the drain with a call live is proved by the
redeploy, and here that the scale-down cut no call); and a Twilio call placed through the
webhook, its media stream straight to a replica."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import speech

# each starts a local Ray cluster: under pytest-xdist, one worker runs them one after another
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
ray = pytest.importorskip("ray", reason="the Ray Serve tests need the ray extra (pip install 'voxline[ray]')")

from agent.commands.ray_serve import APP_NAME, ScaleOptions, voice_app  # noqa: E402

MAX_CALLS = 2  # per replica: four calls fill both, so where each lands is known
FRAME = 320  # samples: 20 ms at 16 kHz, one binary message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config():
    from agent.config import Config

    cfg = Config()
    cfg.asr.threads = 1
    cfg.tts.backend = "espeak"  # the light voice: two replicas share two cores
    cfg.llm.max_tokens = 12
    cfg.llm.batch_threads = 1
    cfg.runtime.gc_freeze = False
    return cfg


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    port = _free_port()
    # A loaded 2-core machine can take longer than Serve's 5 s to start its HTTP proxy (it
    # then kills and restarts it, over and over): give it a minute. Set before the cluster
    # starts, so its processes inherit them.
    for var in ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"):
        os.environ.setdefault(var, "60")
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        origin = f"http://127.0.0.1:{port}"
        options = ScaleOptions(cfg=_config(), max_calls=MAX_CALLS, replicas=2,
                               media_host="127.0.0.1", allowed_origins=[origin],
                               drain_timeout_s=60.0, replica_cpus=1.0)
        t0 = time.monotonic()
        handle = serve.run(voice_app(options), name=APP_NAME, route_prefix="/")
        print(f"\napplication up in {time.monotonic() - t0:.1f} s")
        # "pristine": the application is still the one deployed here (two replicas that have
        # served nothing); a test that deploys another sets it False (see ``redeploy``)
        yield {"origin": origin, "options": options, "handle": handle, "pristine": True}
    finally:
        serve.shutdown()
        ray.shutdown()


@dataclass
class Call:
    """One caller: its placement, what it sent and what it heard."""

    placement: dict
    session: str = ""
    frames_sent: int = 0
    finals: list[str] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    closed_by_server: int | None = None
    more: list[str] = field(default_factory=list)  # clips to say next, on the held line
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def replica(self) -> str:
        return self.placement["replica"]

    def heard(self) -> str:
        return " ".join(self.finals)


async def place(http, origin: str) -> tuple[int, dict]:
    async with http.post(f"{origin}/place") as r:
        return r.status, await r.json()


async def run_call(http, call: Call, origin: str, clips: list[str]) -> None:
    """Stream each clip in real time then silence until its final transcript comes; hold the
    line (silence, or the clips put in ``call.more``) until ``call.hung_up`` is set; then hang
    up."""
    import aiohttp

    ws = await http.ws_connect(call.placement["ws"], headers={"Origin": origin})
    finals_wanted = 0

    async def reader() -> None:
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.TEXT:
                ev = json.loads(msg.data)
                call.events.append(ev)
                if ev["type"] == "ready":
                    call.session = ev["session"]
                elif ev["type"] == "transcript" and ev["final"] and ev["text"].strip():
                    call.finals.append(ev["text"].strip())
        if not call.hung_up.is_set():
            call.closed_by_server = ws.close_code

    task = asyncio.create_task(reader())
    loop = asyncio.get_running_loop()
    t0, k = loop.time(), 0
    silence = np.zeros(FRAME, np.int16).tobytes()

    async def send(frame: bytes) -> None:
        nonlocal k
        await ws.send_bytes(frame)
        call.frames_sent += 1
        k += 1
        await asyncio.sleep(max(0.0, t0 + k * 0.02 - loop.time()))

    async def say(name: str) -> None:
        nonlocal finals_wanted
        pcm = speech.load(name)
        for i in range(0, len(pcm) - FRAME + 1, FRAME):
            await send(pcm[i:i + FRAME].tobytes())
        finals_wanted += 1
        give_up = loop.time() + 30
        while len(call.finals) < finals_wanted and loop.time() < give_up and not ws.closed:
            await send(silence)

    try:
        for name in clips:
            await say(name)
        while not call.hung_up.is_set() and not ws.closed:
            if call.more:
                await say(call.more.pop(0))
            else:
                await send(silence)
    finally:
        if not ws.closed:
            await ws.send_str(json.dumps({"type": "hangup"}))
            await ws.close()
        await asyncio.wait_for(task, 10)


async def replica_health(http, call: Call) -> dict:
    async with http.get(call.placement["base"] + "/healthz") as r:
        return await r.json()


def _wer(reference: str, heard: str) -> float:
    from stages.asr.wer import wer

    return wer(reference, heard)


def redeploy(cluster, app) -> None:  # noqa: ANN001
    """``serve.run`` another application in place of the module's (the tests share one)."""
    from ray import serve

    cluster["pristine"] = False
    serve.run(app, name=APP_NAME, route_prefix="/")


def test_calls_spread_over_both_replicas_and_a_drained_replica_lets_its_calls_finish(cluster):
    import aiohttp
    from ray import serve

    origin = cluster["origin"]
    if not cluster["pristine"]:
        # another test ran first (pytest-xdist or a reordered run): its replicas may hold places
        # for calls that never came and count the calls they served, so start from new ones
        serve.delete(APP_NAME)
        redeploy(cluster, voice_app(cluster["options"]))
        give_up = time.monotonic() + 60
        while _running(serve) != {"RUNNING": 2} and time.monotonic() < give_up:
            time.sleep(0.2)
        assert _running(serve) == {"RUNNING": 2}
    cluster["pristine"] = False  # this test scales it down to one replica
    clips = ["kittens", "honest", "quilter", "wizard"]

    async def main() -> tuple[list[Call], Call, dict[str, list[Call]], list[float]]:
        async with aiohttp.ClientSession() as http:
            # the page, served by the ingress, asks it for a place before calling
            async with http.get(f"{origin}/") as r:
                assert r.status == 200 and 'name="voxline-placement"' in await r.text()
            # --- four calls: two places per replica, so two land on each ------------------------
            setup_ms, calls = [], []
            for _ in clips:
                t = time.perf_counter()
                status, placement = await place(http, origin)
                setup_ms.append((time.perf_counter() - t) * 1000)
                assert status == 200, placement
                calls.append(Call(placement))
            by_replica: dict[str, list[Call]] = {}
            for c in calls:
                by_replica.setdefault(c.replica, []).append(c)
            assert sorted(len(v) for v in by_replica.values()) == [2, 2], by_replica.keys()
            # every place is promised: the next placement is refused, with each replica's why
            status, refused = await place(http, origin)
            assert status == 503 and len(refused["replicas"]) == 2, refused
            assert all("full" in why for why in refused["replicas"]), refused
            # the media goes to each replica's own port, not through Serve's proxy
            ports = {c.placement["ws"].split("/")[2] for c in calls}
            assert len(ports) == 2 and origin.split("/")[2] not in ports
            tasks = {id(c): asyncio.create_task(run_call(http, c, origin, [clip]))
                     for c, clip in zip(calls, clips, strict=True)}
            give_up = time.monotonic() + 90
            while not all(c.finals for c in calls) and time.monotonic() < give_up:
                assert not any(t.done() and t.exception() for t in tasks.values())
                await asyncio.sleep(0.2)
            for c, clip in zip(calls, clips, strict=True):
                assert _wer(speech.text(clip), c.heard()) <= 0.35, (clip, c.heard())
            # --- one caller per replica hangs up: all its frames were served by its replica ----
            first = [cs[0] for cs in by_replica.values()]
            for c in first:
                c.hung_up.set()
            await asyncio.gather(*(tasks[id(c)] for c in first))
            for c in first:
                health = await replica_health(http, c)
                assert health["replica"] == c.replica
                assert health["served"] == 2 and health["calls"] == 1, health
                assert health["audio_frames_in"] == c.frames_sent, (health, c.frames_sent)
                assert health["dropped_inbound_frames"] == 0, health
            # --- redeploy (to one replica) while a call is live on each old one ------------------
            # Serve replaces the old replicas one at a time, each only once it has stopped: so
            # each old replica drains while its call goes on; the caller says one more thing,
            # is heard and hangs up itself, and only then does that replica stop
            rolling = threading.Thread(target=serve.run, args=(voice_app(cluster["options"], 1),),
                                        kwargs={"name": APP_NAME, "route_prefix": "/"}, daemon=True)
            rolling.start()
            held = {cs[1].replica: cs[1] for cs in by_replica.values()}
            drained: list[str] = []
            give_up = time.monotonic() + 150
            while len(drained) < 2 and time.monotonic() < give_up:
                for rid, c in held.items():
                    if rid in drained or (await replica_health(http, c))["status"] != "draining":
                        continue
                    drained.append(rid)
                    # a placement meanwhile never lands on the draining replica
                    status, placement = await place(http, origin)
                    assert status == 200 and placement["replica"] != rid, placement
                    await _say_more(c, "honest")
                    c.hung_up.set()
                    await tasks[id(c)]
                await asyncio.sleep(0.2)
            assert sorted(drained) == sorted(held), drained
            rolling.join(60)
            assert not rolling.is_alive()
            for c in held.values():
                assert c.closed_by_server is None, (c.closed_by_server, c.events[-3:])
                assert not any(e["type"] == "error" and e.get("fatal") for e in c.events)
                assert len(c.finals) >= 2, c.finals
                assert _wer(speech.text("honest"), c.finals[-1]) <= 0.35, c.finals
            await asyncio.gather(*tasks.values())
            # --- the new replica takes the next call ------------------------------------------
            status, placement = await place(http, origin)
            assert status == 200 and placement["replica"] not in by_replica, placement
            late = Call(placement)
            late.hung_up.set()  # once its clip is heard
            await run_call(http, late, origin, ["kittens"])
            assert _wer(speech.text("kittens"), late.heard()) <= 0.35, late.heard()
            return calls, late, by_replica, setup_ms

    calls, late, by_replica, setup_ms = asyncio.run(main())
    # the drained replicas are gone
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        status = serve.status().applications[APP_NAME].deployments["VoiceReplica"]
        if dict(status.replica_states) == {"RUNNING": 1}:
            break
        time.sleep(0.2)
    assert dict(status.replica_states) == {"RUNNING": 1}, status.replica_states
    # the late call lived on the replica it was placed on, and every frame of it was served there
    handle = serve.get_deployment_handle("VoiceReplica", app_name=APP_NAME)
    info = handle.info.remote().result(timeout_s=30)
    assert info["replica"] == late.replica
    assert info["sessions"] == [late.session]
    assert info["audio_frames_in"] == late.frames_sent and info["dropped_inbound_frames"] == 0
    print(f"placement through the ingress: {[round(ms, 1) for ms in setup_ms]} ms")


async def _say_more(call: Call, clip: str) -> None:
    """One more utterance on a held call; returns once it is heard (or 45 s passed)."""
    had = len(call.finals)
    call.more.append(clip)
    give_up = time.monotonic() + 45
    while len(call.finals) <= had and time.monotonic() < give_up:
        await asyncio.sleep(0.2)


def test_a_twilio_call_is_placed_by_the_webhook_and_streams_straight_to_a_replica(cluster):
    """The number's webhook reaches the ingress through Serve's proxy; its TwiML connects the
    media stream to a replica's own port; that replica hears the caller and answers. A full
    application answers the webhook busy."""
    import urllib.parse

    import aiohttp
    from ray import serve
    from websockets.asyncio.client import connect

    from transports.twilio.caller import TwilioCaller

    origin = cluster["origin"]
    options = dataclasses.replace(cluster["options"], twilio=True)
    redeploy(cluster, voice_app(options, 1))  # (the old ones drain)
    call = {"CallSid": "CA" + "1" * 32, "From": "+15550001111", "To": "+15550002222"}

    async def webhook(http: aiohttp.ClientSession) -> str:
        async with http.post(f"{origin}/twilio/twiml", data=call) as r:
            assert r.status == 200 and r.content_type == "text/xml"
            return await r.text()

    async def main() -> tuple[str, str, object]:
        async with aiohttp.ClientSession() as http:
            twiml = await webhook(http)
            url = twiml.split('url="')[1].split('"')[0]
            clip = speech.samples("kittens", rate=8000)
            async with connect(url) as ws:  # the clip, then the line held while the agent answers
                log = await TwilioCaller().run(ws, clip, tail_s=12.0)
            # two more places fill the one replica (max 2): the next call hears busy
            await webhook(http)
            await webhook(http)
            busy = await webhook(http)
        return url, busy, log

    url, busy, log = asyncio.run(main())
    netloc = urllib.parse.urlsplit(url).netloc
    assert url.startswith("ws://127.0.0.1:") and url.endswith("/twilio/media")
    assert netloc != origin.split("/")[2]  # the replica's own port, not Serve's proxy
    assert '<Reject reason="busy"' in busy, busy
    assert log.first_agent_audio_s is not None and len(log.agent_chunks) > 100
    handle = serve.get_deployment_handle("VoiceReplica", app_name=APP_NAME)
    give_up = time.monotonic() + 20
    while True:  # (the call's session closes just after its stream)
        info = handle.info.remote().result(timeout_s=30)
        heard = [texts for texts in info["heard"].values() if texts]
        if heard or time.monotonic() > give_up:
            break
        time.sleep(0.2)
    assert info["twilio"].split("/")[2] == netloc
    assert len(info["sessions"]) == 1 and len(heard) == 1, info["heard"]
    heard = heard[0]
    assert _wer(speech.text("kittens"), " ".join(heard)) <= 0.35, heard


def _running(serve) -> dict:  # noqa: ANN001
    status = serve.status().applications[APP_NAME].deployments["VoiceReplica"]
    return dict(status.replica_states)


def test_replicas_autoscale_on_active_calls_and_scale_down_cuts_no_call(cluster):
    """One replica to start; a second call on the way (active calls 2, one call per replica
    wanted) brings a second replica; once the calls are over the application scales back to
    one, and the call live while it does goes on to its normal end."""
    import aiohttp
    from ray import serve

    origin = cluster["origin"]
    options = dataclasses.replace(
        cluster["options"], replicas=0, min_replicas=1, max_replicas=2, calls_per_replica=1.0,
        upscale_delay_s=1.0, downscale_delay_s=3.0, hold_s=15.0)
    redeploy(cluster, voice_app(options))
    give_up = time.monotonic() + 60
    while _running(serve) != {"RUNNING": 1} and time.monotonic() < give_up:
        time.sleep(0.2)
    assert _running(serve) == {"RUNNING": 1}

    async def wait_for(replicas: int, seconds: float) -> float:
        t0 = time.monotonic()
        while _running(serve) != {"RUNNING": replicas}:
            assert time.monotonic() - t0 < seconds, _running(serve)
            await asyncio.sleep(0.2)
        return time.monotonic() - t0

    async def main() -> tuple[Call, Call, float, float]:
        async with aiohttp.ClientSession() as http:
            status, placed = await place(http, origin)
            assert status == 200
            first = Call(placed)
            first_task = asyncio.create_task(run_call(http, first, origin, ["kittens"]))
            status, _ = await place(http, origin)  # a second call on its way: 2 active
            assert status == 200
            up_s = await wait_for(2, 90)
            status, placed = await place(http, origin)
            assert status == 200
            second = Call(placed)
            second_task = asyncio.create_task(run_call(http, second, origin, ["honest"]))
            while not (first.finals and second.finals):
                assert not any(t.done() and t.exception() for t in (first_task, second_task))
                await asyncio.sleep(0.2)
            first.hung_up.set()
            await first_task
            # one call left, the reservation lapses: down to one replica, the call goes on
            t0 = time.monotonic()
            while _running(serve).get("RUNNING") == 2 and time.monotonic() - t0 < 90:
                if len(second.finals) < 3 and not second.more:
                    second.more.append("quilter")  # the caller keeps talking meanwhile
                await asyncio.sleep(0.2)
            down_s = time.monotonic() - t0
            await _say_more(second, "wizard")  # and after it
            second.hung_up.set()
            await second_task
            await wait_for(1, 60)
            return first, second, up_s, down_s

    first, second, up_s, down_s = asyncio.run(main())
    assert down_s < 90, "never scaled down"
    for c in (first, second):
        assert c.closed_by_server is None, (c.closed_by_server, c.events[-3:])
        assert not any(e["type"] == "error" and e.get("fatal") for e in c.events)
    assert _wer(speech.text("honest"), second.finals[0]) <= 0.35, second.finals
    assert _wer(speech.text("wizard"), second.finals[-1]) <= 0.35, second.finals
    handle = serve.get_deployment_handle("VoiceReplica", app_name=APP_NAME)
    kept = handle.info.remote().result(timeout_s=30)["replica"]
    which = ("the call's own replica: it drained with the call live" if kept != second.replica
             else "the other replica")
    print(f"scaled up in {up_s:.1f} s, down in {down_s:.1f} s; Serve stopped {which}")


def test_the_ingress_page_places_browser_calls_over_websocket_and_webrtc(cluster, tmp_path):
    """Headless Chromium opens the page the ingress serves, presses Call: the page asks for a
    place and calls the replica straight, over WebSocket and then over WebRTC (its offer a
    cross-origin POST to the replica's port); the caller's clip is heard there."""
    from ray import serve
    from test_browser_call import CHROMIUM, _require_browser, chromium_flags, write_mic

    _require_browser()
    from playwright.async_api import async_playwright

    redeploy(cluster, voice_app(cluster["options"], 1))  # one replica
    origin = cluster["origin"]
    # Chromium plays the file from the page's getUserMedia, before the call is connected, and
    # loops it: what the caller says before the media is up is lost (over WebRTC behind a loaded
    # cluster once, "at home." of the sentence). So the sentence comes back every 8.3 s, and the
    # test waits for a final that heard most of it (the reference has 9 words).
    mic = write_mic(tmp_path / "mic.wav", 1.0, speech.load("kittens"), 4.0)
    whole = ("window.voxline.finals.some(f => (typeof f === 'string' ? f : f.text)"
             ".trim().split(/\\s+/).length >= 6)")

    async def main() -> dict[str, dict]:
        got = {}
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=chromium_flags(mic))
            try:
                for transport in ("ws", "webrtc"):
                    page = await browser.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                    await page.goto(f"{origin}/")
                    await page.check(f"input[name=transport][value={transport}]")
                    await page.click("#call")
                    await page.wait_for_function(whole, timeout=90_000, polling=100)
                    await page.click("#call")  # hang up
                    await page.wait_for_function("window.voxline.status === 'ended'",
                                                 timeout=10_000)
                    got[transport] = {"state": await page.evaluate(
                        "JSON.parse(JSON.stringify(window.voxline))"), "errors": errors}
                    await page.close()
            finally:
                await browser.close()
        return got

    got = asyncio.run(main())
    handle = serve.get_deployment_handle("VoiceReplica", app_name=APP_NAME)
    info = handle.info.remote().result(timeout_s=30)
    for transport, page in got.items():
        state = page["state"]
        assert not page["errors"], (transport, page["errors"])
        assert state["replica"] == info["replica"], transport  # placed, then called straight
        assert state["session"] in info["sessions"], transport
        finals = [f["text"] if isinstance(f, dict) else f for f in state["finals"]]
        heard = min(finals, key=lambda f: _wer(speech.text("kittens"), f))
        assert _wer(speech.text("kittens"), heard) <= 0.35, (transport, finals)
