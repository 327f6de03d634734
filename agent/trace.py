"""Per-turn latency tracing against budgets.

A turn runs from the end of the caller's speech to the agent's first audio leaving the
transport. Stages record named events (``trace.event("llm_first_token")``); a span is the time
between two events, and each span has a budget. A finished turn is written as one JSON line and
handed to listeners (the browser's waterfall, ``--json`` output).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# span name -> (start event, end event)
SPANS: dict[str, tuple[str, str]] = {
    "vad_eos": ("speech_end", "vad_decision"),  # the end-of-turn decision (silence or model)
    "turn_model": ("turn_model_request", "turn_model_result"),
    "asr_final": ("vad_decision", "asr_final"),
    "llm_first_token": ("llm_request", "llm_first_token"),
    "llm_first_chunk": ("llm_first_token", "tts_request"),
    "tts_first_audio": ("tts_request", "tts_first_audio"),
    "transport_send": ("tts_first_audio", "audio_out"),
    "voice_to_voice": ("speech_end", "audio_out"),
}
GREETING_SPANS: dict[str, tuple[str, str]] = {
    "tts_first_audio": ("tts_request", "tts_first_audio"),
    "transport_send": ("tts_first_audio", "audio_out"),
    "greeting": ("call_start", "audio_out"),
}
SPAN_ORDER = ["vad_eos", "turn_model", "asr_final", "llm_first_token", "llm_first_chunk", "tts_first_audio",
              "transport_send", "voice_to_voice", "greeting", "partial_lag"]


@dataclass(slots=True)
class Turn:
    index: int
    kind: str  # "turn" | "greeting"
    events: dict[str, int] = field(default_factory=dict)  # event name -> monotonic ns
    text: str = ""
    reply: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # facts about the turn (model verdicts)

    @property
    def origin(self) -> int:
        return self.events.get("call_start" if self.kind == "greeting" else "speech_end", 0)


class Trace:
    """Collects the events of one session's turns and writes finished turns as JSON lines."""

    def __init__(
        self,
        budgets: Mapping[str, float] | None = None,
        path: str | Path | None = None,
        session_id: str = "",
        sink: IO[str] | None = None,
    ) -> None:
        self.budgets = dict(budgets or {})
        self.session_id = session_id
        self._own_file = False
        self._out: IO[str] | None = sink
        if path:
            self._out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._own_file = True
        self._lock = threading.Lock()
        self._turn: Turn | None = None
        self._n = 0
        # the latest finished turns (a long call must not grow memory); counts cover all of them
        self.turns: deque[dict[str, Any]] = deque(maxlen=32)
        self.complete_turns = 0
        self.violations: dict[str, int] = {}
        self.partial_lags_ms: deque[float] = deque(maxlen=4096)  # the latest, for the summary
        self.call_events: deque[dict[str, Any]] = deque(maxlen=32)  # see call_event
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    # --- recording ---------------------------------------------------------------------------
    @property
    def current(self) -> Turn | None:
        return self._turn

    def begin_turn(self, kind: str = "turn", **events: int) -> Turn:
        """Open a turn; an open one is closed first as abandoned (e.g. interrupted)."""
        with self._lock:
            if self._turn is not None:
                self._finish(self._turn, complete=False)
            self._n += 1
            turn = Turn(self._n, kind, {k: v for k, v in events.items() if v})
            self._turn = turn
            return turn

    def event(self, name: str, t_ns: int | None = None) -> None:
        """Record ``name`` for the open turn (the first occurrence wins). ``audio_out`` closes it."""
        turn = self._turn
        if turn is None or name in turn.events:
            return
        turn.events[name] = t_ns if t_ns is not None else time.monotonic_ns()
        if name == "audio_out":
            with self._lock:
                if self._turn is turn:
                    self._turn = None
                    self._finish(turn, complete=True)

    def note(self, text: str | None = None, reply: str | None = None) -> None:
        turn = self._turn
        if turn is not None:
            if text is not None:
                turn.text = text
            if reply is not None:
                turn.reply = reply

    def info(self, **facts: Any) -> None:
        """Facts about the open turn, written with it (``p_complete``, ``preempted``)."""
        turn = self._turn
        if turn is not None:
            turn.info.update(facts)

    def call_event(self, name: str, t_ns: int | None = None, **fields: Any) -> None:
        """A moment of the call outside its turns (an idle re-prompt, the agent hanging up):
        written at once as a line of type ``event`` and listed in the session summary. Turn
        listeners never see it (they draw turns)."""
        record = {"type": "event", "session": self.session_id, "event": name,
                  "t_ns": t_ns if t_ns is not None else time.monotonic_ns(), **fields}
        self.call_events.append(record)
        self._write(record)

    def abandon(self) -> None:
        """Close the open turn without agent audio (interrupted, or nothing to say)."""
        with self._lock:
            if self._turn is not None:
                self._finish(self._turn, complete=False)
                self._turn = None

    def partial_lag(self, ms: float) -> None:
        self.partial_lags_ms.append(ms)
        budget = self.budgets.get("partial_lag")
        if budget is not None and ms > budget:
            self.violations["partial_lag"] = self.violations.get("partial_lag", 0) + 1

    # --- output ------------------------------------------------------------------------------
    def _finish(self, turn: Turn, complete: bool) -> None:
        origin = turn.origin
        spans: dict[str, dict[str, Any]] = {}
        table = GREETING_SPANS if turn.kind == "greeting" else SPANS
        for name, (a, b) in table.items():
            ta, tb = turn.events.get(a), turn.events.get(b)
            if ta is None or tb is None:
                continue
            dur = (tb - ta) / 1e6
            budget = self.budgets.get(name)
            over = budget is not None and dur > budget
            if over:
                self.violations[name] = self.violations.get(name, 0) + 1
            spans[name] = {
                "start_ms": round((ta - origin) / 1e6, 3) if origin else 0.0,
                "end_ms": round((tb - origin) / 1e6, 3) if origin else round(dur, 3),
                "ms": round(dur, 3),
                "budget_ms": budget,
                "over": over,
            }
        record = {
            "type": turn.kind,
            "session": self.session_id,
            "turn": turn.index,
            "complete": complete,
            "t0_ns": origin,
            "events_ms": {
                k: round((v - origin) / 1e6, 3) if origin else 0.0
                for k, v in sorted(turn.events.items(), key=lambda kv: kv[1])
            },
            "spans": spans,
            "text": turn.text,
            "reply": turn.reply,
        }
        if turn.info:
            record["info"] = dict(turn.info)
        self.turns.append(record)
        self.complete_turns += complete and turn.kind == "turn"
        self._write(record)
        for fn in self.listeners:
            fn(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self._out is not None:
            self._out.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._out.flush()

    def close(self, reason: str = "") -> dict[str, Any]:
        """Close the open turn and write the session summary line; ``reason`` is why the call
        ended (``hangup``, ``idle``, ...)."""
        self.abandon()
        summary = {
            "type": "session",
            "session": self.session_id,
            "reason": reason,
            "turns": self.complete_turns,
            "violations": dict(self.violations),
            "partial_lag_ms": [round(x, 2) for x in self.partial_lags_ms],
        }
        if self.call_events:
            summary["events"] = [
                {k: v for k, v in e.items() if k not in ("type", "session")}
                for e in self.call_events
            ]
        self._write(summary)
        if self._own_file and self._out is not None:
            self._out.close()
            self._out = None
        return summary
