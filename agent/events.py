"""Frames and trace records as JSON-ready events: what ``voxline run --json`` prints and what the
browser and other clients receive."""

from __future__ import annotations

from typing import Any

from agent.frames import (
    SAMPLE_RATE,
    BotStartedSpeaking,
    BotStoppedSpeaking,
    ErrorFrame,
    Frame,
    Interrupt,
    LLMEnd,
    LLMTextDelta,
    PausePlayout,
    ResumePlayout,
    SpeechStarted,
    SpeechStopped,
    TextToSpeak,
    Transcript,
    UserTurnEnded,
)

# The frame kinds :func:`frame_event` turns into events: what a listener that forwards events
# consumes (``Session.listen(fn, EVENT_FRAMES)``), so caller audio need not reach it.
EVENT_FRAMES: frozenset[type[Frame]] = frozenset({
    Transcript, UserTurnEnded, LLMTextDelta, LLMEnd, TextToSpeak, SpeechStarted, SpeechStopped,
    Interrupt, PausePlayout, ResumePlayout, BotStartedSpeaking, BotStoppedSpeaking, ErrorFrame,
})


def frame_event(frame: Frame, t0_ns: int = 0) -> dict[str, Any] | None:
    """The event for ``frame``, or None for frames clients don't see (audio)."""
    t = round((frame.t_ns - t0_ns) / 1e9, 3) if t0_ns else None
    ev: dict[str, Any]
    if isinstance(frame, Transcript):
        ev = {
            "type": "transcript",
            "final": frame.final,
            "text": frame.text,
            "stable": frame.stable,
            "speculative": frame.speculative,
            "start_s": round(frame.start / SAMPLE_RATE, 3),
            "end_s": round(frame.end / SAMPLE_RATE, 3),
        }
    elif isinstance(frame, UserTurnEnded):
        ev = {"type": "user_turn", "text": frame.text}
    elif isinstance(frame, LLMTextDelta):
        ev = {"type": "agent_delta", "text": frame.text}
    elif isinstance(frame, LLMEnd):
        ev = {"type": "agent_text", "text": frame.text, "cancelled": frame.cancelled}
    elif isinstance(frame, TextToSpeak):
        ev = {"type": "agent_say", "text": frame.text, "greeting": frame.greeting}
    elif isinstance(frame, SpeechStarted):
        ev = {"type": "speech_started", "at_s": round(frame.at / SAMPLE_RATE, 3)}
    elif isinstance(frame, SpeechStopped):
        ev = {"type": "speech_stopped", "at_s": round(frame.at / SAMPLE_RATE, 3)}
    elif isinstance(frame, Interrupt):
        ev = {"type": "interrupt", "at_s": round(frame.at / SAMPLE_RATE, 3)}
    elif isinstance(frame, PausePlayout):
        ev = {"type": "agent_paused", "at_s": round(frame.at / SAMPLE_RATE, 3)}
    elif isinstance(frame, ResumePlayout):
        ev = {"type": "agent_resumed"}
    elif isinstance(frame, BotStartedSpeaking):
        ev = {"type": "bot_started"}
    elif isinstance(frame, BotStoppedSpeaking):
        ev = {"type": "bot_stopped", "interrupted": frame.interrupted}
    elif isinstance(frame, ErrorFrame):
        ev = {"type": "error", "message": frame.message, "stage": frame.stage, "fatal": frame.fatal}
        if frame.code:
            ev["code"] = frame.code
    else:
        return None
    if t is not None:
        ev["t"] = t
    return ev


def trace_event(record: dict[str, Any]) -> dict[str, Any]:
    """A finished turn of the trace, as clients receive it (the waterfall's data); ``kind`` is
    the record's own type (turn or greeting)."""
    return {**record, "kind": record["type"], "type": "trace"}
