"""benchmarks/soak.py's own logic: the RSS flatness and leak arithmetic, the descriptor census,
the sipp scenarios and the ledger of ``voxline sip --json`` records, the echo LLM through the
real OpenAI-compatible client, and the browser caller against a real ``VoiceServer`` (answered
and hung up, cut mid-call, never answered, and the slot probe against a real slot pool)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from soak_browser import browser_call, hold_call, quiet_frames, speech_frames  # noqa: E402
from soak_llm import EchoLLM, reply_for  # noqa: E402
from soak_metrics import fd_kinds, grown, leaked, rss_flatness, snapshot  # noqa: E402
from soak_sip import SipLedger, SippGroup, judge, judge_echo, scenario, write_caller_wav  # noqa: E402

from agent.commands.telephony import CallPrinter  # noqa: E402
from agent.events import trace_event  # noqa: E402
from agent.frames import AudioIn, Direction, Frame, TTSAudio, UserTurnEnded  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.stage import Stage, StageContext  # noqa: E402
from agent.trace import Trace  # noqa: E402
from stages.asr.slots import SlotPool  # noqa: E402


# --- the numbers ---------------------------------------------------------------------------------
def _series(f, seconds: float = 600.0, every: float = 5.0) -> list[tuple[float, float]]:
    return [(t, f(t)) for t in np.arange(0.0, seconds + every / 2, every)]


def test_flat_rss_with_noise_passes_and_growth_in_the_first_half_is_not_counted() -> None:
    rng = np.random.default_rng(3)
    noisy = _series(lambda t: 300.0 * (1 + 0.005 * rng.standard_normal()))
    assert abs(rss_flatness(noisy, 0.0, 600.0)["drift_pct"]) < 0.5
    # 10% of growth while the pools fill, then flat: the second half is flat
    warm = _series(lambda t: 300.0 * (1 + 0.1 * min(t, 250.0) / 250.0))
    f = rss_flatness(warm, 0.0, 600.0)
    assert f["drift_pct"] == pytest.approx(0.0, abs=0.01)
    assert f["from_s"] == 300.0 and f["to_s"] == 600.0 and f["samples"] == 61


def test_steady_growth_over_the_second_half_is_its_drift() -> None:
    # +3% from t=300 to t=600, linearly: the drift says 3%, and so does the spread (smoothed)
    leak = _series(lambda t: 300.0 * (1 + 0.03 * max(0.0, t - 300.0) / 300.0))
    f = rss_flatness(leak, 0.0, 600.0)
    assert f["drift_pct"] == pytest.approx(3.0, abs=0.05)
    assert 2.0 < f["spread_pct"] < 3.05
    # a shrinking process drifts negative (the bar judges the absolute value)
    shrink = _series(lambda t: 300.0 * (1 - 0.03 * t / 600.0))
    assert rss_flatness(shrink, 0.0, 600.0)["drift_pct"] < -1.4


def test_too_few_samples_give_no_verdict() -> None:
    f = rss_flatness([(0.0, 1.0), (4.0, 1.0), (8.0, 1.0)], 0.0, 10.0)
    assert f["samples"] == 1 and f["drift_pct"] is None and f["spread_pct"] is None


def test_only_more_is_a_leak() -> None:
    assert leaked({"fds": 17, "threads": 9, "sessions": 0, "tasks": None},
                  {"fds": 16, "threads": 11, "sessions": 2, "tasks": 5}) == \
        {"fds": 0, "threads": 2, "sessions": 2, "tasks": None}
    assert grown({"pipe": 4, "tcp listen": 1}, {"pipe": 4, "tcp listen": 1, "tcp close-wait": 1,
                                                "udp": 0}) == {"tcp close-wait": 1}


def test_the_descriptor_census_names_what_is_open() -> None:
    before = snapshot(os.getpid())
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    try:
        kinds = fd_kinds(os.getpid())
        assert kinds.get("tcp listen", 0) >= 1 and kinds.get("tcp established", 0) >= 2
        assert snapshot(os.getpid()).fds == before.fds + 3
        assert before.rss_kb > 0 and before.threads >= 1 and before.cpu_s > 0
    finally:
        for s in (client, server_side, listener):
            s.close()


# --- SIP ----------------------------------------------------------------------------------------
def test_sipp_scenarios(tmp_path: Path) -> None:
    wav = tmp_path / "caller.wav"
    normal = ET.fromstring(scenario("normal", wav, 9300))
    assert [e.tag for e in normal][-3:] == ["pause", "send", "recv"]
    assert f"{wav},1,0" in ET.tostring(normal).decode()
    assert "BYE sip:" in "".join(normal.itertext())
    vanish = ET.fromstring(scenario("vanish", wav, 9300))
    text = ET.tostring(vanish).decode()
    assert "BYE sip:" not in "".join(vanish.itertext())  # gone: no BYE ever comes
    assert 'distribution="uniform"' in text and 'max="9300"' in text and "pause" in text
    probe = ET.fromstring(scenario("probe", wav, 6000))  # streams the quiet: no RTP timeout
    assert f"{wav},1,0" in ET.tostring(probe).decode() and "BYE sip:" in "".join(probe.itertext())
    assert 'milliseconds="6000"' in ET.tostring(probe).decode()
    with pytest.raises(ValueError, match="unknown sipp caller"):
        scenario("drop", wav, 1)
    with pytest.raises(ValueError, match="streams a WAV"):
        scenario("normal", None, 1)


def test_the_caller_wav_is_8k_ulaw_with_the_quiet_after_it(tmp_path: Path) -> None:
    import soundfile as sf

    pcm16k = (3000 * np.sin(np.arange(16000) / 5)).astype(np.int16)  # 1 s
    packets = write_caller_wav(pcm16k, None, 2.0, tmp_path / "a.wav")
    info = sf.info(tmp_path / "a.wav")
    assert (info.samplerate, info.subtype) == (8000, "ULAW")
    assert packets == 150 and info.frames == 24000
    tail = sf.read(tmp_path / "a.wav", dtype="int16")[0][-8000:]
    assert 0 < np.sqrt(np.mean(tail.astype(float) ** 2)) < 40  # the line's noise, not silence


def _sip_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What ``voxline sip --json`` prints for four calls of sipp process 4242, by its printer."""
    printer = CallPrinter(as_json=True)
    turn = {"type": "turn", "session": "c1", "turn": 1, "complete": True, "text": "hi",
            "spans": {"voice_to_voice": {"ms": 612.5, "budget_ms": 800.0}}}
    ended = {"type": "call", "state": "ended", "seconds": 11.8, "malformed_rtp": 0, "dtmf": "",
             "jitter": {"received": 569, "lost": 0, "late": 0, "duplicate": 0, "reordered": 0}}
    for n, call in enumerate(("c1", "c2", "c3", "c4"), 1):
        printer.emit(call, {"type": "call", "state": "ringing", "sip_call_id": f"{n}-4242@127.0.0.1"})
    printer.emit("c1", trace_event(turn))
    printer.emit("c1", {**ended, "reason": "bye"})
    printer.emit("c2", {**ended, "reason": "bye"})  # no answer
    printer.emit("c3", {**ended, "reason": "rtp-timeout"})
    return capsys.readouterr().out.splitlines()


def test_the_ledger_reads_the_servers_records(capsys: pytest.CaptureFixture[str]) -> None:
    ledger = SipLedger()
    ledger.phase = "run"
    for line in _sip_lines(capsys):
        ledger.feed(line)
    ledger.feed("not json")
    # the set-up of c4 failed: its only trace is the log line (no end record comes)
    ledger.log_line("2026-12-01 15:02:42,396 voxline.sip WARNING call 4-4242@127.0.0.1 refused: "
                    "all 10 ASR slots are in use")
    assert ledger.unparsed == 1 and ledger.active == 0
    c1, c2, c3, c4 = (ledger.calls[c] for c in ("c1", "c2", "c3", "c4"))
    assert c1.sipp_pid == 4242 and c1.phase == "run" and c1.voice_to_voice_ms == [612.5]
    normal = SippGroup("g", "normal", "clip", Path("x.xml"), 5, 569, 11.7)
    vanish = SippGroup("g", "vanish", "clip", Path("x.xml"), 5, 569, 11.7)
    assert judge(c1, normal) == ("completed", "")
    assert judge(c2, normal) == ("lost", "no answer")
    assert judge(c3, normal)[0] == "lost"  # a caller that BYEs was cut by the server
    assert judge(c3, vanish) == ("killed", "")
    assert judge(c1, vanish)[0] == "lost"  # a vanished caller must be ended by the timeout
    assert judge(c4, normal) == ("failed", "refused by the server")
    ledger.feed(json.dumps({"call": "c5", "type": "call", "state": "ringing",
                            "sip_call_id": "9-4242@127.0.0.1"}))
    assert ledger.active == 1 and judge(ledger.calls["c5"], normal)[0] == "lost"


# --- the echo LLM ---------------------------------------------------------------------------------
def test_the_echo_llm_through_the_real_client() -> None:
    from agent.config import LLMConfig
    from stages.llm.openai import OpenAILLM

    async def main() -> tuple[str, int]:
        llm = EchoLLM()
        url = await llm.start()
        try:
            client = OpenAILLM(LLMConfig(backend="openai", base_url=url))
            messages = [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": "the two stray kittens gradually make"}]
            text = "".join([t async for t in client.stream(messages)])
            return text, llm.requests
        finally:
            await llm.stop()

    text, requests = asyncio.run(main())
    assert text == "You said the two stray kittens." == reply_for("the two stray kittens x")
    assert requests == 1
    assert reply_for("  ") == "Sorry, I did not hear you."


def test_the_echo_llm_refuses_what_is_not_a_chat_request() -> None:
    import aiohttp

    async def main() -> tuple[list[int], int, int]:
        llm = EchoLLM()
        url = await llm.start()
        try:
            async with aiohttp.ClientSession() as http:
                codes = []
                for body in (b"{not json", b'{"messages": 3}', b'{"messages": [{"role": "system"}]}'):
                    async with http.post(url + "/chat/completions", data=body) as r:
                        codes.append(r.status)
            return codes, llm.bad, llm.requests
        finally:
            await llm.stop()

    assert asyncio.run(main()) == ([400, 400, 400], 3, 0)


def test_a_slot_the_probe_cannot_take_after_the_run_leaked() -> None:
    from soak import server_report

    def measured(fds: int, kinds: dict[str, int], tasks: int | None = None) -> dict:
        return {"sessions": 0, "fds": fds, "threads": 9, "rss_kb": 300 * 1024, "fd_kinds": kinds,
                "tasks": tasks, "asr_slots_in_use": None if tasks is None else 0}

    rep = server_report(measured(17, {"pipe": 4}), measured(18, {"pipe": 4, "tcp close-wait": 1}),
                        {"admitted": 10, "refused": ["full"]}, {"admitted": 9, "refused": ["full"]},
                        cpu_run_s=30.0, wall_s=60.0, call_minutes=10.0, concurrent=5)
    assert rep["leaked"] == {"sessions": 0, "fds": 1, "threads": 0, "free_slots": 1,
                             "close_wait": 1, "tasks": None, "asr_slots_in_use": None}
    assert rep["fds_grown"] == {"tcp close-wait": 1}
    assert rep["cpu_s_per_call_minute"] == 3.0 and rep["cores_used"] == 0.5
    assert rep["cores_per_call"] == 0.1
    # a socket left in CLOSE_WAIT is leaked even when the baseline already had it (a leak in
    # the warm-up), though the count did not grow
    stale = server_report(measured(18, {"tcp close-wait": 1}), measured(18, {"tcp close-wait": 1}),
                          {"admitted": 10, "refused": ["full"]},
                          {"admitted": 10, "refused": ["full"]}, 1.0, 1.0, 1.0)
    assert stale["leaked"]["fds"] == 0 and stale["leaked"]["close_wait"] == 1
    # where a server reports its asyncio tasks, more of them after the run leaked
    tasks = server_report(measured(17, {}, tasks=12), measured(17, {}, tasks=15),
                          {"admitted": 10, "refused": ["full"]},
                          {"admitted": 10, "refused": ["full"]}, 1.0, 1.0, 1.0)
    assert tasks["leaked"]["tasks"] == 3 and tasks["leaked"]["asr_slots_in_use"] == 0
    assert rep["probe_valid"]
    # a probe that refused nothing measured nothing: the pool was never full
    assert not server_report(measured(17, {}), measured(17, {}), {"admitted": 11, "refused": []},
                             {"admitted": 11, "refused": []}, 1.0, 1.0, 1.0)["probe_valid"]


# --- the browser caller against a real server -------------------------------------------------------
class TurnTaker(Stage):
    """The caller's loud stretch, then 200 ms of quiet, is a turn: its text, and 300 ms of tone
    as the answer (``answer=False``: no answer, ever)."""

    def __init__(self, answer: bool = True) -> None:
        super().__init__("turn-taker")
        self.answer = answer
        self.loud = 0
        self.quiet = 0

    def process(self, frame: Frame, direction: Direction) -> None:
        self.push(frame, direction)
        if not isinstance(frame, AudioIn):
            return
        if np.abs(frame.pcm).max() > 1000:
            self.loud, self.quiet = self.loud + 1, 0
            return
        self.quiet += 1
        if self.loud >= 5 and self.quiet == 10:
            self.loud = 0
            self.push(UserTurnEnded("hello there"))
            if self.answer:
                tone = (4000 * np.sin(2 * np.pi * 440 * np.arange(4800) / 16000)).astype(np.int16)
                self.push(TTSAudio(tone, last=True))


class SlotHolder(Stage):
    """Holds one slot of a real ASR slot pool for the call, as the ASR stage does."""

    def __init__(self, pool: SlotPool) -> None:
        super().__init__("slot-holder")
        self.pool = pool
        self.slot = None

    async def start(self, ctx: StageContext) -> None:
        await super().start(ctx)
        self.slot = self.pool.acquire()  # CapacityError: the call is refused

    async def stop(self) -> None:
        if self.slot is not None:
            self.pool.release(self.slot)
            self.slot = None


async def _with_server(factory, body, echo=None):  # noqa: ANN001, ANN202 - a test helper
    from transports.server import VoiceServer

    server = VoiceServer(factory, port=0, max_calls=10, new_echo_session=echo)
    port = await server.start()
    try:
        return await body(server, f"ws://127.0.0.1:{port}/ws")
    finally:
        await server.stop()


async def _until(cond, timeout: float = 5.0) -> bool:  # noqa: ANN001 - a test helper
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return cond()


TONE = (3000 * np.sin(np.arange(9600) / 3)).astype(np.int16)  # 0.6 s of "speech"


def test_an_answered_call_hangs_up_and_the_server_frees_it() -> None:
    async def body(server, url):  # noqa: ANN001, ANN202
        out = await browser_call(url, "tone", speech_frames(TONE), quiet_frames(),
                                 answer_timeout_s=10.0)
        return out, await _until(lambda: not server.calls), server.served

    out, freed, served = asyncio.run(_with_server(
        lambda: Session(Pipeline([TurnTaker()]), Trace({})), body))
    assert out.status == "completed", out
    assert out.session.startswith("call-") and out.answers == 1 and not out.errors
    assert out.agent_frames >= 14  # 300 ms of tone came back (15 frames, the last cut short)
    assert out.frames_sent >= len(speech_frames(TONE)) + 70  # the clip and the 1.5-s linger
    assert out.dropped_inbound == 0 and out.killed_at_s is None
    assert freed and served == 1


def test_a_call_cut_mid_turn_is_killed_and_the_server_frees_it() -> None:
    async def body(server, url):  # noqa: ANN001, ANN202
        out = await browser_call(url, "tone", speech_frames(TONE), quiet_frames(),
                                 answer_timeout_s=10.0, kill_at_s=0.4)
        return out, await _until(lambda: not server.calls)

    out, freed = asyncio.run(_with_server(
        lambda: Session(Pipeline([TurnTaker()]), Trace({})), body))
    assert out.status == "killed" and 0.4 <= out.killed_at_s < 1.5
    assert out.answers == 0 and freed


def test_a_call_never_answered_is_lost() -> None:
    async def body(server, url):  # noqa: ANN001, ANN202
        return await browser_call(url, "tone", speech_frames(TONE), quiet_frames(),
                                  answer_timeout_s=2.0)

    out = asyncio.run(_with_server(
        lambda: Session(Pipeline([TurnTaker(answer=False)]), Trace({})), body))
    assert out.status == "lost" and out.reason == "no answer 2 s after the clip"


def test_a_refused_connection_fails() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    out = asyncio.run(browser_call(f"ws://127.0.0.1:{port}/ws", "tone", speech_frames(TONE),
                                   quiet_frames(), answer_timeout_s=1.0))
    assert out.status == "failed" and out.reason.startswith("connect:")


def test_the_slot_probe_fills_the_pool_and_the_extra_call_is_refused() -> None:
    pool = SlotPool(capacity=3, max_seconds=0.1)

    async def body(server, url):  # noqa: ANN001, ANN202
        verdicts: list[str] = []
        release = asyncio.Event()
        holds = [asyncio.create_task(hold_call(url, verdicts, release)) for _ in range(4)]
        full = await _until(lambda: len(verdicts) == 4, 10.0)
        in_use = pool.in_use
        release.set()
        await asyncio.gather(*holds)
        return full, verdicts, in_use, await _until(lambda: not server.calls and not pool.in_use)

    full, verdicts, in_use, freed = asyncio.run(_with_server(
        lambda: Session(Pipeline([SlotHolder(pool)]), Trace({})), body))
    assert full and in_use == 3 and verdicts.count("admitted") == 3
    refused = [v for v in verdicts if v != "admitted"]
    assert len(refused) == 1 and "all 3 ASR slots are in use" in refused[0]
    assert freed


def _echo_session() -> Session:
    from agent.config import Config
    from agent.presets import new_echo_test_session

    return new_echo_test_session(Config())


def test_an_echo_test_call_gets_every_frame_back_and_the_server_frees_it() -> None:
    async def body(server, url):  # noqa: ANN001, ANN202
        out = await browser_call(url + "/echo", "tone", speech_frames(TONE), quiet_frames(),
                                 answer_timeout_s=5.0, echo=True)
        return out, await _until(lambda: not server.calls), server.served

    out, freed, served = asyncio.run(_with_server(
        lambda: Session(Pipeline([TurnTaker(answer=False)]), Trace({})), body, echo=_echo_session))
    assert out.status == "completed", out
    assert out.kind == "echo" and out.echo_lost == 0 and not out.errors
    # the clip and the quiet after it came back, each frame about the jitter buffer late
    assert len(out.echo_rtt_ms) >= len(speech_frames(TONE)) + 20
    assert 50 <= float(np.median(out.echo_rtt_ms)) < 1000  # (the pacer sends a little ahead)
    assert freed and served == 1


def test_an_echo_that_loses_frames_is_lost() -> None:
    class Lossy(Stage):  # drops every 25th frame of the echo
        def __init__(self) -> None:
            super().__init__("lossy")
            self.n = 0

        def process(self, frame: Frame, direction: Direction) -> None:
            if isinstance(frame, TTSAudio) and len(frame.pcm):
                self.n += 1
                if self.n % 25 == 0:
                    return
            self.push(frame, direction)

    def lossy_echo() -> Session:
        from stages.echo_test import EchoTest

        return Session(Pipeline([EchoTest(), Lossy()]), Trace({}))

    async def body(server, url):  # noqa: ANN001, ANN202
        return await browser_call(url + "/echo", "tone", speech_frames(TONE), quiet_frames(),
                                  answer_timeout_s=5.0, echo=True)

    out = asyncio.run(_with_server(lambda: None, body, echo=lossy_echo))
    assert out.status == "lost" and "frames did not come back" in out.reason
    assert out.echo_lost >= 2


def test_without_the_echo_test_there_is_no_echo_route() -> None:
    async def body(server, url):  # noqa: ANN001, ANN202
        return await browser_call(url + "/echo", "tone", speech_frames(TONE), quiet_frames(),
                                  answer_timeout_s=1.0, echo=True)

    out = asyncio.run(_with_server(lambda: None, body))
    assert out.status == "failed" and "404" in out.reason


def test_a_sip_echo_call_is_judged_by_what_it_played_back() -> None:
    end = {"reason": "bye", "jitter": {"received": 500}}
    assert judge_echo(end)[0] == "lost"  # no counts at all
    assert judge_echo({**end, "echo_test": {"echoed_samples": 500 * 320 - 1000,
                                            "dropped_samples": 0}}) == ("completed", "")
    short = judge_echo({**end, "echo_test": {"echoed_samples": 400 * 320, "dropped_samples": 0}})
    assert short[0] == "lost" and "played back 128000 of 160000" in short[1]
    dropped = judge_echo({**end, "echo_test": {"echoed_samples": 500 * 320,
                                               "dropped_samples": 320}})
    assert dropped[0] == "lost" and "dropped 320" in dropped[1]


# --- the whole script, briefly ------------------------------------------------------------------------
@pytest.mark.slow
def test_a_short_soak_runs_end_to_end(tmp_path: Path) -> None:
    """Both servers as subprocesses, two browser callers and two sipp callers (one of each to the
    agent, one to the echo test) for 12 s (~50 s in all: two model loads, warm-up, two probes):
    the last line printed is the JSON written, the probes are valid, nothing is lost or
    leaked."""
    import shutil
    import subprocess

    if shutil.which("sipp") is None:
        pytest.skip("sipp is not installed (apt-get install -y sip-tester)")
    out = tmp_path / "soak.json"
    # the repo's own clips (a clean checkout has no ../shared): a speech set of two
    speech = tmp_path / "speech"
    speech.mkdir()
    data = Path(__file__).parent / "data"
    lines = []
    for name, seconds in (("ls-dev-clean-1988-24833-0000", 3.32),
                          ("ls-dev-clean-1272-128104-0000", 5.855)):
        shutil.copy(data / f"{name}.wav", speech / f"{name}.wav")
        lines.append(json.dumps({"id": name, "path": f"{name}.wav", "duration_s": seconds,
                                 "kind": "read"}))
    (speech / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "soak.py"), "--minutes", "0.2", "--browser-calls", "2",
         "--browser-agent-calls", "1", "--sip-calls", "2", "--sip-agent-calls", "1",
         "--warmup-s", "2", "--settle-s", "1", "--sip-listen-s", "3",
         "--sample-s", "1", "--speech", str(speech), "--json-out", str(out)],
        capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    lines = proc.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == {k: v for k, v in result.items()
                                     if k not in ("rss_samples", "browser_call_log", "warmup")}
    assert proc.returncode == (0 if result["pass"] else 1), proc.stderr[-2000:]
    for kind in ("browser", "sip"):
        calls = result["calls"][kind]
        assert calls["completed"] >= 1 and calls["lost"] == 0 and calls["failed"] == 0, calls
    for name in ("serve", "sip"):
        server = result["servers"][name]
        assert server["probe_valid"], result["probes"]
        assert not any(server["leaked"].values()), server
        assert server["rss_flatness"]["samples"] >= 3
    assert result["calls"]["sip"]["rtp_missing"] == 0
    assert any(line.startswith("serve  fds") for line in lines)
    # one caller of each kind reached the agent, the other the echo test, which lost nothing
    assert result["agent_calls"] == {"browser": 1, "sip": 1}
    browser, sip = result["calls"]["browser"], result["calls"]["sip"]
    assert 1 <= browser["echo_test_calls"] < browser["started"] and browser["echo_frames_lost"] == 0
    assert browser["voice_to_voice_p50_ms"] is not None and browser["echo_round_trip_p50_ms"]
    assert 1 <= sip["echo_test_calls"] < sip["started"]
