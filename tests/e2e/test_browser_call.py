"""End to end in a real browser: headless Chromium (Debian's ``chromium``, driven by Playwright's
Python package) calls ``voxline serve``'s server over WebSocket and over WebRTC, its fake
microphone playing a real recording, with the embedded models answering."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import wave
from pathlib import Path

import numpy as np
import pytest
import speech

from agent.audio import float_to_int16, int16_to_float

CHROMIUM = "/usr/bin/chromium"
SPANS = ["vad_eos", "asr_final", "llm_first_token", "llm_first_chunk", "tts_first_audio",
         "transport_send", "voice_to_voice"]
CLIP = ("kittens", speech.text("kittens"))  # far from the ASR's edge (tests/speech.py)
INTERRUPTER = "quilter"
SCREENSHOTS = Path(os.environ.get("VOXLINE_SCREENSHOTS", tempfile.gettempdir()))

pytestmark = pytest.mark.slow


def _require_browser() -> None:
    """Skip without Chromium or Playwright, except in CI (CI=true), where that is a failure."""
    missing = []
    if not os.path.exists(CHROMIUM):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package (pip install playwright; never `playwright install`)")
    if missing:
        why = "browser tests need " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def chromium_flags(mic_wav: Path) -> list[str]:
    return [
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={mic_wav}",
        "--autoplay-policy=no-user-gesture-required",
        # WebRTC on loopback only: Chromium skips 127.0.0.1 candidates unless told, and would
        # offer mDNS names aioice cannot resolve
        "--allow-loopback-in-peer-connection",
        "--disable-features=WebRtcHideLocalIpsWithMdns",
        # no DNS look-ups of Google's update and account hosts
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE localhost",
    ]


def read_clip(name: str) -> np.ndarray:
    return speech.load(name)


def write_mic(path: Path, *parts: np.ndarray | float) -> Path:
    """A fake-microphone file: clips and seconds of silence in order, as 48 kHz PCM16 (Chromium
    loops the file, so it ends with enough silence for the test to finish first)."""
    import soxr

    pcm = np.concatenate([
        np.zeros(int(p * 16000), np.int16) if isinstance(p, float) else p for p in parts
    ])
    up = soxr.resample(int16_to_float(pcm), 16000, 48000)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48000)
        w.writeframes(float_to_int16(up).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def models():
    _require_browser()
    from agent.config import Config
    from agent.presets import load_models

    cfg = Config()
    return cfg, load_models(cfg)


def session_factory(models):
    from agent.presets import build_pipeline
    from agent.session import Session
    from agent.trace import Trace

    cfg, loaded = models
    return lambda: Session(build_pipeline(cfg, loaded), Trace(cfg.trace.budgets))


PAGE_FACTS = """() => ({
  spans: [...document.querySelectorAll('#waterfall .turn:last-child .row')].map(r => r.dataset.span),
  bars: document.querySelectorAll('#waterfall .bar').length,
  bargeCount: document.getElementById('barge-count').textContent,
  callerLines: document.querySelectorAll('#log li.caller').length,
  agentLines: document.querySelectorAll('#log li.agent').length,
})"""


async def browser_call(new_session, mic_wav: Path, transport: str, until: str, shot: str,
                       timeout_s: float = 90.0,
                       server_options: dict | None = None) -> tuple[dict, dict, object]:
    """One call from the page: Call, wait for ``until`` (JS over ``v = window.voxline``),
    screenshot, Hang up. Returns the page's state, facts read off the page's DOM and the
    server (after the hang-up). ``server_options`` go to the VoiceServer."""
    from playwright.async_api import async_playwright

    from transports.server import VoiceServer

    server = VoiceServer(new_session, port=0, **(server_options or {}))
    await server.start()
    profile = tempfile.mkdtemp(prefix="voxline-chromium-")
    page_errors: list[str] = []
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=chromium_flags(mic_wav),
                viewport={"width": 960, "height": 900})
            page = browser.pages[0] if browser.pages else await browser.new_page()
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            await page.goto(server.url)
            await page.check(f"input[name=transport][value={transport}]")
            await page.click("#call")
            try:
                await page.wait_for_function(f"(v => {until})(window.voxline)",
                                             timeout=timeout_s * 1000, polling=100)
            finally:
                state = await page.evaluate("JSON.parse(JSON.stringify(window.voxline))")
                facts = await page.evaluate(PAGE_FACTS)
                await page.screenshot(path=str(SCREENSHOTS / shot), full_page=True)
            assert len(server.calls) == 1
            await page.click("#call")  # Hang up
            await page.wait_for_function("window.voxline.status === 'ended'", timeout=5000)
            async with asyncio.timeout(10):
                while server.calls:
                    await asyncio.sleep(0.05)
            await browser.close()
    finally:
        await server.stop()
        shutil.rmtree(profile, ignore_errors=True)
    assert not page_errors, page_errors
    return state, facts, server


ANSWERED = ("v.finals.length > 0 && v.replies.some(r => !r.greeting && !r.cancelled)"
            " && v.traces.some(t => t.kind === 'turn' && t.complete) && v.agentMaxRms > 0.01")


@pytest.mark.parametrize("transport", ["ws", "webrtc"])
def test_browser_call_transcribes_answers_and_plays_the_agent(models, transport, tmp_path):
    from stages.asr.wer import wer

    name, reference = CLIP
    mic = write_mic(tmp_path / "mic.wav", 0.8, read_clip(name), 14.0)
    until = (ANSWERED + " && document.querySelectorAll('#waterfall .turn').length > 0"
             " && v.voiceToVoiceMs.length > 0")
    state, facts, server = asyncio.run(browser_call(
        session_factory(models), mic, transport, until, f"voxline-browser-{transport}.png"))
    heard = " ".join(state["finals"])
    assert wer(reference, heard) <= 0.35, heard
    assert any(r["text"].strip() for r in state["replies"]) and facts["agentLines"] >= 1
    assert state["agentMaxRms"] > 0.01  # the agent's voice reached the page's AnalyserNode
    turn = next(t for t in state["traces"] if t["kind"] == "turn" and t["complete"])
    assert set(SPANS) <= set(turn["spans"])
    assert set(SPANS) <= set(facts["spans"])  # the waterfall drew a bar for every span
    assert server.served == 1 and not server.calls  # the hang-up freed the call
    # the page timed the turn itself: from the caller's voice end at capture to the agent's
    # first audible audio where it plays it, which cannot come before the server answered
    assert state["micClock"] == "capture"
    # ... and it timed this turn, not the call: it exceeds the server's own span by the audio's
    # trip to the server and back to the speaker only (measured 22-37 ms, idle or with both cores
    # busy; timed from the call's start it would be 4 s over). Both spans hold the model time, so
    # a loaded machine stretches them alike (1.1-1.7 s seen); the latency goal is benchmarks'.
    server_ms, page_ms = turn["spans"]["voice_to_voice"]["ms"], state["voiceToVoiceMs"][0]
    assert server_ms < page_ms < server_ms + 1000
    print(f"\n[{transport}] heard {heard!r}; reply {state['replies'][0]['text']!r}; "
          f"voice-to-voice (trace) {turn['spans']['voice_to_voice']['ms']:.0f} ms; "
          f"page-measured {state['voiceToVoiceMs']} ms")


def test_browser_barge_in_interrupts_the_agent(models, tmp_path):
    """The caller speaks again while the agent answers: the agent stops and the page shows it."""
    name, _ = CLIP
    mic = write_mic(tmp_path / "mic.wav", 0.8, read_clip(name), 2.2, read_clip(INTERRUPTER), 12.0)
    until = "v.interrupts > 0 && v.finals.length > 1"
    state, facts, _ = asyncio.run(browser_call(
        session_factory(models), mic, "ws", until, "voxline-browser-barge-in.png"))
    assert state["interrupts"] >= 1 and facts["bargeCount"] == str(state["interrupts"])
    assert len(state["finals"]) >= 2  # the interrupting speech was heard and transcribed
