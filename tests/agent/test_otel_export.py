"""OpenTelemetry export (agent/otel.py) against a real OTLP/HTTP receiver on loopback: real
sessions become one ``call`` span each, with turn spans under it and stage spans under those,
at the trace's times and with its budgets; nothing is sent by an exporter that is not watching,
and a process that never builds one never imports OpenTelemetry."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from otlp_receiver import Receiver, attrs

from agent import observe
from agent.errors import ConfigError, MissingExtraError
from agent.frames import Frame, TextToSpeak, TTSAudio, UserTurnEnded
from agent.otel import OtelExporter, enabled_by_env, traces_endpoint
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import QueuedStage
from agent.trace import Trace

BUDGETS = {"llm_first_token": 5.0, "tts_first_audio": 5_000.0, "voice_to_voice": 5_000.0}
LLM_S = 0.03  # the scripted LLM's first token: always over its 5 ms budget
STEP_S = 0.005
SLACK_NS = 5_000  # the trace rounds its milliseconds to the microsecond
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    pytest.importorskip("opentelemetry.sdk.trace")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    r = Receiver(pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2"))
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_SERVICE_NAME",
                "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER",
                "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", r.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield r
    r.close()


class ScriptedAgent(QueuedStage):
    """Stamps a turn's events the way the real stages do, around short sleeps: a caller's turn
    (VAD, ASR, LLM, TTS) for each UserTurnEnded, a greeting for TextToSpeak(greeting=True)."""

    name = "scripted"
    consumes = frozenset({UserTurnEnded, TextToSpeak})

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, (UserTurnEnded, TextToSpeak))

    async def handle(self, frame: Frame) -> None:
        trace = self.ctx.trace
        pcm = np.full(320, 100, np.int16)
        if isinstance(frame, TextToSpeak):
            trace.begin_turn("greeting", call_start=self.ctx.started_ns)
            trace.event("tts_request")
            await asyncio.sleep(STEP_S)
            trace.event("tts_first_audio")
            self.push(TTSAudio(pcm, last=True, text=frame.text))
            return
        assert isinstance(frame, UserTurnEnded)
        trace.begin_turn(speech_end=frame.t_ns)
        trace.event("vad_decision")
        await asyncio.sleep(STEP_S)
        trace.event("asr_final")
        trace.note(text=frame.text)
        trace.event("llm_request")
        await asyncio.sleep(LLM_S)
        trace.event("llm_first_token")
        trace.note(reply="Sure.")
        trace.event("tts_request")
        await asyncio.sleep(STEP_S)
        trace.event("tts_first_audio")
        self.push(TTSAudio(pcm, last=True, text="Sure."))


async def play_out(session: Session) -> None:
    """A transport: wait for the agent's audio, send it (the trace's audio_out), drain."""
    for _ in range(500):
        if session.playout.pull() is not None:
            session.playout.sent()
            while session.playout.pull() is not None:
                pass
            return
        await asyncio.sleep(0.002)
    raise AssertionError("no agent audio")


async def a_call(words: list[str], fail: bool = False, unanswered: str = "") -> tuple[Session, list[dict]]:
    """One call: a greeting, a turn per entry of ``words``, and optionally a last turn the
    call ends on before any reply (abandoned); ``fail`` ends it on an exception."""
    session = Session(Pipeline([ScriptedAgent()]), Trace(BUDGETS))
    records: list[dict] = []
    try:
        async with session:
            session.trace.listeners.append(records.append)
            session.push(TextToSpeak("Hello.", greeting=True))
            await play_out(session)
            for text in words:
                session.push(UserTurnEnded(text))
                await play_out(session)
            if unanswered:
                session.push(UserTurnEnded(unanswered))
                await asyncio.sleep(STEP_S * 2)  # inside the LLM's wait: not answered yet
            if fail:
                raise RuntimeError("the transport broke")
    except RuntimeError:
        assert fail
    return session, records


def test_calls_become_span_trees_at_the_traces_times(receiver: Receiver) -> None:
    exporter = OtelExporter.from_env()
    assert exporter.endpoint == receiver.url
    unwatch = observe.watch(exporter)

    async def main() -> list[tuple[Session, list[dict]]]:
        return list(await asyncio.gather(
            a_call(["What's the time?", "Thanks."], unanswered="And the"),
            a_call(["Hello?"], fail=True)))

    try:
        (ok, ok_records), (bad, bad_records) = asyncio.run(main())
    finally:
        unwatch()
        exporter.shutdown()

    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    got = receiver.spans()
    assert {res["service.name"] for res, _ in got} == {"voxline"}
    spans = [s for _, s in got]
    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans)  # each span sent once
    calls = [s for s in spans if s.name == "call"]
    assert sorted(attrs(c)["session.id"] for c in calls) == sorted([ok.id, bad.id])  # one each
    for call in calls:
        assert call.parent_span_id == b"" and call.kind == call.SPAN_KIND_SERVER

    for session, records in ((ok, ok_records), (bad, bad_records)):
        (call,) = [c for c in calls if attrs(c)["session.id"] == session.id]
        a = attrs(call)
        assert a["voxline.reason"] == session.summary["reason"]
        assert a["voxline.turns"] == session.summary["turns"]
        assert a["voxline.violations"] == sum(session.summary["violations"].values()) > 0
        assert a["voxline.violated_spans"] == ["llm_first_token"]
        # the call span starts at the session's start (epoch = monotonic + the offset then)
        offset = observe.wall_offset_ns()
        assert abs(call.start_time_unix_nano - (session.started_ns + offset)) < 50_000_000
        turns = [s for s in spans if s.parent_span_id == call.span_id]
        assert all(t.trace_id == call.trace_id for t in turns)
        assert [(t.name, attrs(t)["voxline.turn"]) for t in sorted(turns, key=lambda t: attrs(t)["voxline.turn"])] \
            == [(r["type"], r["turn"]) for r in records]
        for record in records:
            (turn,) = [t for t in turns if attrs(t)["voxline.turn"] == record["turn"]]
            ta = attrs(turn)
            assert ta["voxline.complete"] is record["complete"]
            assert ta["voxline.text_length"] == len(record["text"])
            assert "voxline.text" not in ta and "voxline.reply" not in ta  # privacy by default
            assert call.start_time_unix_nano <= turn.start_time_unix_nano
            assert turn.end_time_unix_nano <= call.end_time_unix_nano
            stages = {s.name: s for s in spans if s.parent_span_id == turn.span_id}
            assert set(stages) == set(record["spans"])
            t0 = turn.start_time_unix_nano  # no event precedes the origin in these turns
            last_ms = max(record["events_ms"].values())
            assert abs(turn.end_time_unix_nano - t0 - last_ms * 1e6) < SLACK_NS
            for name, want in record["spans"].items():
                s, sa = stages[name], attrs(stages[name])
                assert s.trace_id == call.trace_id and s.kind == s.SPAN_KIND_INTERNAL
                assert turn.start_time_unix_nano <= s.start_time_unix_nano
                assert s.end_time_unix_nano <= turn.end_time_unix_nano
                assert abs(s.start_time_unix_nano - t0 - want["start_ms"] * 1e6) < SLACK_NS
                assert abs(s.end_time_unix_nano - t0 - want["end_ms"] * 1e6) < SLACK_NS
                assert sa["voxline.ms"] == pytest.approx(want["ms"])
                assert sa["voxline.over_budget"] is want["over"]
                assert sa.get("voxline.budget_ms") == BUDGETS.get(name)
                assert s.status.code == s.status.STATUS_CODE_UNSET  # over budget is no error
            if record["type"] == "turn" and record["complete"]:
                llm = attrs(stages["llm_first_token"])
                assert llm["voxline.over_budget"] is True and llm["voxline.ms"] >= LLM_S * 1000
                assert attrs(stages["tts_first_audio"])["voxline.over_budget"] is False
                assert ta["voxline.over_budget"] is True

    ok_call = next(c for c in calls if attrs(c)["session.id"] == ok.id)
    bad_call = next(c for c in calls if attrs(c)["session.id"] == bad.id)
    assert ok.summary["reason"] == "hangup" and ok_call.status.code == ok_call.status.STATUS_CODE_UNSET
    assert bad.summary["reason"] == "error" and bad_call.status.code == bad_call.status.STATUS_CODE_ERROR
    # the call that ended mid-turn: its last turn is there, abandoned, without an LLM span
    assert [r["complete"] for r in ok_records] == [True, True, True, False]
    assert "llm_first_token" not in ok_records[-1]["spans"]


def test_text_is_exported_only_when_asked(receiver: Receiver) -> None:
    exporter = OtelExporter.from_env(include_text=True)
    unwatch = observe.watch(exporter)
    try:
        asyncio.run(a_call(["My number is 555."]))
    finally:
        unwatch()
        exporter.shutdown()
    (turn,) = [s for _, s in receiver.spans() if s.name == "turn"]
    assert attrs(turn)["voxline.text"] == "My number is 555."
    assert attrs(turn)["voxline.reply"] == "Sure."


def test_nothing_is_sent_without_watching(receiver: Receiver) -> None:
    exporter = OtelExporter.from_env()
    asyncio.run(a_call(["Hello?"]))  # built, never watched
    unwatch = observe.watch(exporter)
    unwatch()
    asyncio.run(a_call(["Hello again?"]))  # watched, then no longer
    exporter.shutdown()
    assert receiver.requests == [] and receiver.spans() == []


def test_call_events_and_the_tool_hook(receiver: Receiver) -> None:
    """A call event is a span event on the call span; a tool call (the LLM stage's
    ``tool_call`` event, turned into a span by the default ``event_spans``) is a child span of
    the call instead, with its tool and outcome. A turn that failed is an error."""
    exporter = OtelExporter.from_env()
    unwatch = observe.watch(exporter)

    async def main() -> Session:
        session = Session(Pipeline([ScriptedAgent()]), Trace(BUDGETS))
        async with session:
            session.trace.call_event("idle_reprompt", at_s=1.5, silence_s=8.0)
            session.trace.call_event("tool_call", tool="weather", ms=12.5, outcome="timeout")
            session.trace.begin_turn(speech_end=time.monotonic_ns())
            session.trace.info(error="llm_timeout")
            session.trace.abandon()
        return session

    try:
        session = asyncio.run(main())
    finally:
        unwatch()
        exporter.shutdown()
    spans = [s for _, s in receiver.spans()]
    (call,) = [s for s in spans if s.name == "call"]
    (event,) = call.events
    assert event.name == "idle_reprompt" and attrs(event)["voxline.silence_s"] == 8.0
    (tool,) = [s for s in spans if s.name == "tool_call"]
    assert tool.parent_span_id == call.span_id and attrs(tool)["voxline.tool"] == "weather"
    assert attrs(tool)["voxline.outcome"] == "timeout"
    assert tool.end_time_unix_nano - tool.start_time_unix_nano == 12_500_000
    assert attrs(call)["voxline.turns"] == session.summary["turns"] == 0
    (turn,) = [s for s in spans if s.name == "turn"]  # a turn that failed: an error, said why
    assert turn.status.code == turn.status.STATUS_CODE_ERROR and turn.status.message == "llm_timeout"
    assert attrs(turn)["voxline.info.error"] == "llm_timeout"
    assert call.status.code == call.status.STATUS_CODE_UNSET


def test_open_calls_end_at_shutdown(receiver: Receiver) -> None:
    exporter = OtelExporter.from_env()
    session = Session(Pipeline([ScriptedAgent()]))
    session.started_ns = time.monotonic_ns()
    exporter.call_started(session)
    exporter.shutdown()
    (call,) = [s for _, s in receiver.spans()]
    assert attrs(call)["voxline.open_at_shutdown"] is True


def test_resource_follows_the_sdks_environment(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "front-desk")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    exporter = OtelExporter.from_env()
    assert exporter.resource.attributes["service.name"] == "front-desk"
    assert exporter.resource.attributes["deployment.environment"] == "test"
    exporter.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ConfigError, match="http/protobuf"):
        OtelExporter.from_env()


def test_enabled_by_env_and_the_endpoint_it_names() -> None:
    url = "http://collector:4318"
    assert traces_endpoint({}) == "http://localhost:4318/v1/traces"
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": url + "/"}) == url + "/v1/traces"
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": url,
                            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}) == "http://t:1/x"
    assert not enabled_by_env({})
    assert enabled_by_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url})
    assert enabled_by_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url + "/v1/traces"})
    assert not enabled_by_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SDK_DISABLED": "True"})
    assert not enabled_by_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_TRACES_EXPORTER": "none"})
    assert enabled_by_env({"OTEL_TRACES_EXPORTER": "otlp"})  # the SDK's default endpoint


def test_a_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(MissingExtraError, match=r"voxline\[otel\]") as err:
        OtelExporter()
    assert err.value.extra == "otel"


def test_without_an_exporter_nothing_imports_opentelemetry() -> None:
    code = (
        "import asyncio, sys\n"
        "import numpy as np\n"
        "from agent import otel\n"
        "from agent.frames import TTSAudio\n"
        "from agent.pipeline import Pipeline\n"
        "from agent.session import Session\n"
        "from agent.stage import Stage\n"
        "async def main():\n"
        "    async with Session(Pipeline([Stage()])) as s:\n"
        "        s.trace.begin_turn(speech_end=1)\n"
        "        s.push(TTSAudio(np.zeros(320, np.int16), last=True))\n"
        "        s.playout.pull(); s.playout.sent()\n"
        "    assert s.summary['turns'] == 1, s.summary\n"
        "asyncio.run(main())\n"
        "otel.enabled_by_env()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
