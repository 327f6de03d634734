import json
import subprocess
import sys

from agent.report import load_records, summarize
from agent.trace import Trace

MS = 1_000_000


def _turn(tr: Trace, t0: int, v2v_ms: float, llm_ms: float = 100):
    tr.begin_turn(speech_end=t0, vad_decision=t0 + 300 * MS, asr_final=t0 + 350 * MS)
    tr.event("llm_request", t0 + 350 * MS)
    tr.event("llm_first_token", t0 + int((350 + llm_ms) * MS))
    tr.event("tts_request", t0 + int((360 + llm_ms) * MS))
    tr.event("tts_first_audio", t0 + int((400 + llm_ms) * MS))
    tr.event("audio_out", t0 + int(v2v_ms * MS))


def test_spans_budgets_and_violations(tmp_path):
    path = tmp_path / "t.jsonl"
    tr = Trace({"voice_to_voice": 800, "llm_first_token": 250}, path=path, session_id="s1")
    seen = []
    tr.listeners.append(seen.append)
    _turn(tr, 10**12, 600)
    _turn(tr, 2 * 10**12, 900, llm_ms=400)
    summary = tr.close()
    assert summary["turns"] == 2
    assert summary["violations"] == {"voice_to_voice": 1, "llm_first_token": 1}
    first, second = seen
    assert first["spans"]["voice_to_voice"]["ms"] == 600 and not first["spans"]["voice_to_voice"]["over"]
    assert second["spans"]["voice_to_voice"]["over"] and second["spans"]["llm_first_token"]["over"]
    assert first["spans"]["vad_eos"] == {"start_ms": 0.0, "end_ms": 300.0, "ms": 300.0,
                                         "budget_ms": None, "over": False}
    assert first["spans"]["asr_final"]["start_ms"] == 300.0
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["type"] for r in lines] == ["turn", "turn", "session"]


def test_first_event_wins_and_events_after_close_are_ignored():
    tr = Trace()
    tr.begin_turn(speech_end=1000)
    tr.event("llm_first_token", 2000)
    tr.event("llm_first_token", 3000)
    assert tr.current.events["llm_first_token"] == 2000
    tr.event("audio_out", 4000)
    assert tr.current is None
    tr.event("llm_first_token", 5000)  # no open turn: ignored
    assert len(tr.turns) == 1 and tr.turns[0]["complete"]


def test_new_turn_abandons_the_open_one():
    tr = Trace()
    tr.begin_turn(speech_end=1)
    tr.begin_turn(speech_end=2)
    tr.close()
    assert [t["complete"] for t in tr.turns] == [False, False]


def test_report_percentiles_and_cli(tmp_path):
    path = tmp_path / "t.jsonl"
    tr = Trace({"voice_to_voice": 700}, path=path)
    for i in range(1, 101):
        _turn(tr, i * 10**12, 500 + 3 * i)  # 503 .. 800 ms
    tr.partial_lag(120.0)
    tr.close()
    s = summarize(load_records(path))
    v = s["spans"]["voice_to_voice"]
    assert v["n"] == 100 and abs(v["p50"] - 651.5) < 1e-6 and v["over"] == 34
    assert s["spans"]["partial_lag"]["n"] == 1
    png = tmp_path / "w.png"
    r = subprocess.run([sys.executable, "-m", "agent.cli", "trace", "report", str(path), "--png",
                        str(png)], capture_output=True, text=True, check=True)
    assert "voice_to_voice" in r.stdout and "p95" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_rejects_garbage(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    r = subprocess.run([sys.executable, "-m", "agent.cli", "trace", "report", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not a JSON line" in r.stderr and "Traceback" not in r.stderr
