"""One table of streaming-ASR behaviour, run against both shells of the stream core: the
in-process :class:`StreamingASR` stage and ``asr-serve`` over its Unix socket (VAD events sent
by the client). A deterministic fake backend reads "words" out of the audio, so each case's
inputs map to exactly one list of outputs — the same for both shells.

The audio language: a word is 300 ms of one constant sample value (its index in WORDS, times
512), a space between words is 100 ms of zeros, ``_`` is 400 ms of zeros. The fake backend names
every run of one non-zero value at least 40 ms long, in order: a buffer that starts or ends
inside a word still names it, which is how a real model hears a clipped word too.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest

from agent.config import ASRConfig
from agent.frames import AudioIn, EndOfCall, SpeechPaused, SpeechStarted, SpeechStopped, Transcript
from agent.stage import DOWN, Stage, StageContext
from stages.asr import wire
from stages.asr.backend import ASRCapabilities, BatchCost, Hypothesis
from stages.asr.engine import ASREngine
from stages.asr.server import ASRServer
from stages.asr.stage import StreamingASR, ring_seconds, stream_config

SR = 16_000
FRAME = 320
WORD = int(0.3 * SR)
GAP = int(0.1 * SR)
SILENCE = int(0.4 * SR)
WORDS = ("", "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")
MIN_RUN = int(0.04 * SR)


def speech(text: str) -> np.ndarray:
    parts = []
    for w in text.split():
        if w == "_":
            parts.append(np.zeros(SILENCE, np.int16))
        else:
            parts += [np.full(WORD, WORDS.index(w) * 512, np.int16), np.zeros(GAP, np.int16)]
    return np.concatenate(parts)


class WordBackend:
    """Names the words in each buffer; records every call (audio length, prompt)."""

    name = "words"

    def __init__(self) -> None:
        self.capabilities = ASRCapabilities(sample_rate=SR, max_batch=8, lanes=1,
                                            batch_cost=BatchCost.LINEAR, prompts=True)
        self.calls: list[tuple[int, str]] = []

    @property
    def sample_rate(self) -> int:
        return SR

    @property
    def max_batch(self) -> int:
        return 8

    def transcribe_batch(self, audio, prompts=None):
        out = []
        for i, buf in enumerate(audio):
            self.calls.append((len(buf), prompts[i] if prompts else ""))
            out.append(Hypothesis(self.read(buf)))
        return out

    @staticmethod
    def read(buf: np.ndarray) -> str:
        codes = np.rint(np.asarray(buf, np.float64) * 32768 / 512).astype(np.int64)
        words = []
        edges = np.flatnonzero(np.diff(codes)) + 1
        for run in np.split(codes, edges):
            if len(run) >= MIN_RUN and run[0] > 0:
                words.append(WORDS[run[0]])
        return " ".join(words)

    def warmup(self) -> None:
        pass


# --- the cases ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """``script``: audio text; ``events``: (time s, "start"|"pause"|"stop", at s[, started s]);
    ``expect``: (kind, text, stable) for every transcript, kind partial|speculative|final."""

    name: str
    script: str
    events: tuple
    expect: tuple
    cfg: dict | None = None
    max_call_s: float | None = None  # no model call may read more audio than this


def s(t: float) -> int:
    return int(round(t * SR))


CASES = [
    Case(
        "one utterance, no pause hint: partials grow, one final",
        "_ alpha bravo charlie delta _ _",
        ((0.46, "start", 0.4), (2.1, "stop", 2.0, 0.4)),
        (("partial", "alpha", 0),
         ("partial", "alpha bravo", 5),
         ("partial", "alpha bravo charlie", 11),
         ("partial", "alpha bravo charlie delta", 19),
         ("final", "alpha bravo charlie delta", 25)),
    ),
    Case(
        "a pause the stop confirms: the speculative result is the final",
        "_ alpha bravo charlie _ _",
        ((0.46, "start", 0.4), (1.64, "pause", 1.6), (1.9, "stop", 1.6, 0.4)),
        (("partial", "alpha", 0),
         ("partial", "alpha bravo", 5),
         ("partial", "alpha bravo charlie", 11),
         ("speculative", "alpha bravo charlie", 19),  # up to the pause (+100 ms)
         ("partial", "alpha bravo charlie", 19),  # partials go on until the stop
         ("final", "alpha bravo charlie", 19)),
    ),
    Case(
        "speech resumes after a pause: the final covers all of it",
        "_ alpha bravo _ charlie delta _ _",
        ((0.46, "start", 0.4), (1.24, "pause", 1.2), (2.8, "pause", 2.8),
         (3.1, "stop", 2.8, 0.4)),
        (("partial", "alpha", 0),
         ("partial", "alpha bravo", 5),
         ("speculative", "alpha bravo", 11),
         ("partial", "alpha bravo", 11),
         ("partial", "alpha bravo charlie", 11),
         ("partial", "alpha bravo charlie delta", 19),
         ("partial", "alpha bravo charlie delta", 25),
         ("speculative", "alpha bravo charlie delta", 25),  # the second pause's: the final
         ("partial", "alpha bravo charlie delta", 25),
         ("final", "alpha bravo charlie delta", 25)),
    ),
    Case(
        "two utterances, each with its own final",
        "_ alpha bravo _ _ charlie delta _ _",
        ((0.46, "start", 0.4), (1.5, "stop", 1.2, 0.4), (2.06, "start", 2.0),
         (3.1, "stop", 2.8, 2.0)),
        (("partial", "alpha", 0),
         ("partial", "alpha bravo", 5),
         ("partial", "alpha bravo", 11),
         ("final", "alpha bravo", 11),
         ("partial", "charlie", 0),
         ("partial", "charlie delta", 7),
         ("partial", "charlie delta", 13),
         ("final", "charlie delta", 13)),
    ),
]


def long_case() -> Case:
    """A 20-word utterance (8 s): its tail is committed, so no partial reads more than the
    commit threshold plus a partial interval, and the final still has every word."""
    words = " ".join(WORDS[1:21])
    end = 0.4 + 20 * 0.4
    partials = []
    return Case("a long utterance: committed tail, bounded calls, every word in the final",
                f"_ {words} _ _", ((0.46, "start", 0.4), (end + 0.3, "stop", end, 0.4)),
                tuple(partials), cfg={"commit_after_s": 3.0}, max_call_s=3.0 + 0.4 + 0.1)


def segment_case() -> Case:
    words = " ".join(WORDS[1:26])  # 10 s
    end = 0.4 + 25 * 0.4
    return Case("an utterance longer than max_utterance_s: a segment final, then the rest",
                f"_ {words} _ _", ((0.46, "start", 0.4), (end + 0.3, "stop", end, 0.4)),
                (), cfg={"max_utterance_s": 6.0, "commit_after_s": 0.0})


# --- the two shells ------------------------------------------------------------------------------

class Sink(Stage):
    def __init__(self) -> None:
        super().__init__("sink")
        self.got: list[Transcript] = []

    def process(self, frame, direction):
        if isinstance(frame, Transcript):
            self.got.append(frame)


class Counter(Stage):
    def __init__(self) -> None:
        super().__init__("counter")
        self.finals = 0

    def process(self, frame, direction):
        if isinstance(frame, Transcript) and frame.final:
            self.finals += 1


def timeline(case: Case):
    """The case as (sample, action) steps: 20-ms audio frames, each VAD event after the frame
    whose end passes its time (as a VAD's follow the audio)."""
    audio = speech(case.script)
    events = sorted(case.events)
    steps, k = [], 0
    for off in range(0, len(audio), FRAME):
        steps.append(("audio", off, audio[off : off + FRAME]))
        while k < len(events) and s(events[k][0]) <= off + FRAME:
            steps.append(("event", events[k]))
            k += 1
    return steps


def config(case: Case) -> ASRConfig:
    return ASRConfig(**(case.cfg or {}))


async def run_stage_shell(case: Case, backend: WordBackend):
    cfg = config(case)
    engine = ASREngine(backend, capacity=1, window_ms=0, max_seconds=ring_seconds(cfg))
    stage = StreamingASR(engine, cfg)
    sink = Sink()
    stage.link(sink)
    await stage.start(StageContext())
    try:
        for step in timeline(case):
            if step[0] == "audio":
                stage.process(AudioIn(step[2], offset=step[1]), DOWN)
            else:
                ev = step[1]
                kind, at = ev[1], s(ev[2])
                frame = (SpeechStarted(at) if kind == "start" else SpeechPaused(at)
                         if kind == "pause" else SpeechStopped(at, started_at=s(ev[3])))
                stage.process(frame, DOWN)
            await idle(lambda: not stage.busy)
        stage.process(EndOfCall(), DOWN)
    finally:
        await stage.stop()
        engine.close()
    return [(("partial" if not t.final else "final"), t.text, t.stable, t.start, t.end)
            for t in sink.got]


async def run_server_shell(case: Case, backend: WordBackend, tmp_path):
    cfg = config(case)
    engine = ASREngine(backend, capacity=1, window_ms=0, max_seconds=ring_seconds(cfg))
    server = ASRServer(engine, stream=stream_config(cfg, SR))  # as the stage shell's
    path = str(tmp_path / "asr.sock")
    await server.start_unix(path)
    reader, writer = await asyncio.open_unix_connection(path)
    decoder = wire.Decoder()
    got: list = []
    kinds = {wire.SpeechEvent.STARTED: "start", wire.SpeechEvent.PAUSED: "pause",
             wire.SpeechEvent.STOPPED: "stop"}
    by_name = {v: k for k, v in kinds.items()}

    sent = 0

    def send(frame: bytes) -> None:
        nonlocal sent
        writer.write(frame)
        sent += 1

    async def settle():
        await writer.drain()
        await idle(lambda: server.connections)
        conn = next(iter(server.connections))
        await idle(lambda: conn.handled == sent)
        await idle(lambda: all(not st.core.busy for st in conn.streams.values()
                               if st.core is not None))
        while len(got) < conn.sent:  # everything the server sent is read
            got.extend(decoder.feed(await asyncio.wait_for(reader.read(1 << 16), 10)))

    try:
        send(wire.encode_open(1, {"events": True}))
        for step in timeline(case):
            if step[0] == "audio":
                send(wire.encode_audio(1, step[2].tobytes()))
            else:
                ev = step[1]
                send(wire.encode_event(1, by_name[ev[1]], s(ev[2]), s(ev[3]) if len(ev) > 3 else 0))
            await settle()
        send(wire.encode_end(1))
        await settle()
    finally:
        writer.close()
        await server.close()
        engine.close()
    assert isinstance(got[-1], wire.End), "the server ends the stream once it has said all"
    out = []
    for m in got[:-1]:
        assert isinstance(m, (wire.Partial, wire.Final)), m
        kind = "final" if isinstance(m, wire.Final) else \
            "speculative" if m.speculative else "partial"
        out.append((kind, m.text, m.stable, m.start, m.samples))
    return out


async def idle(check, timeout=10.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    await asyncio.sleep(0)
    while not check():
        if loop.time() > end:
            raise AssertionError("the stream never went idle")
        await asyncio.sleep(0.001)
    await asyncio.sleep(0)


def run_shell(shell: str, case: Case, tmp_path):
    backend = WordBackend()
    if shell == "stage":
        out = asyncio.run(run_stage_shell(case, backend))
    else:
        out = asyncio.run(run_server_shell(case, backend, tmp_path))
    return out, backend


def brief(out, shell):
    """(kind, text, stable); the stage's frames do not say which partials are speculative."""
    return [("partial" if k == "speculative" and shell == "stage" else k, t, st)
            for k, t, st, *_ in out]


@pytest.fixture(params=["stage", "server"])
def shell(request):
    return request.param


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_table(shell, case, tmp_path):
    out, _ = run_shell(shell, case, tmp_path)
    want = [("partial" if k == "speculative" and shell == "stage" else k, t, st)
            for k, t, st in case.expect]
    assert brief(out, shell) == want


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_shells_give_the_same_transcripts_and_spans(case, tmp_path):
    stage, _ = run_shell("stage", case, tmp_path)
    server, _ = run_shell("server", case, tmp_path)
    assert [(k if k == "final" else "partial", *rest) for k, *rest in server] == stage
    finals = [o for o in stage if o[0] == "final"]
    stops = [e for e in case.events if e[1] == "stop"]
    assert [(start, end) for *_, start, end in finals] == [(s(e[3]), s(e[2])) for e in stops]


def test_a_long_utterance_reads_only_its_tail(shell, tmp_path):
    case = long_case()
    out, backend = run_shell(shell, case, tmp_path)
    finals = [o for o in out if o[0] == "final"]
    assert [f[1] for f in finals] == [" ".join(WORDS[1:21])]
    final_call = max(n for n, _ in backend.calls)
    assert final_call >= s(8.0)  # the final re-reads the whole utterance
    longest = max(n for n, _ in backend.calls if n != final_call) / SR
    assert longest <= case.max_call_s, f"a partial read {longest:.2f} s"
    # the committed words are the model's context
    assert any(p.startswith("alpha bravo") for _, p in backend.calls)
    partials = [o for o in out if o[0] != "final"]
    stable = ""
    for _, text, n, *_ in partials:  # the stable prefix never moves back
        assert text.startswith(stable)
        stable = text[:n]
    assert len(stable.split()) >= 10
    # and without commits, the same utterance's calls grow with it
    case0 = Case(case.name, case.script, case.events, (), cfg={"commit_after_s": 0.0})
    out0, backend0 = run_shell(shell, case0, tmp_path)
    assert [o[1] for o in out0 if o[0] == "final"] == [f[1] for f in finals]
    assert max(n for n, _ in backend0.calls) / SR > 8.0


def test_a_too_long_utterance_is_cut_into_a_segment_and_the_rest(shell, tmp_path):
    out, backend = run_shell(shell, segment_case(), tmp_path)
    finals = [o for o in out if o[0] == "final"]
    assert len(finals) == 3  # 10 s of speech, at most 6 s a part
    assert " ".join(f[1] for f in finals) == " ".join(WORDS[1:26])
    for a, b in zip(finals, finals[1:], strict=False):
        assert a[4] == b[3]  # each part starts where the one before was cut
        assert b[4] - b[3] <= s(6.0)
    first = finals[0][1].split()
    assert any(p.endswith(first[-1]) for _, p in backend.calls)  # the rest is read in context


def test_asr_serve_without_events_is_one_utterance_with_stable_partials(tmp_path):
    async def main():
        backend = WordBackend()
        engine = ASREngine(backend, capacity=1, window_ms=0)
        server = ASRServer(engine)
        path = str(tmp_path / "asr.sock")
        await server.start_unix(path)
        reader, writer = await asyncio.open_unix_connection(path)
        audio = speech("alpha bravo charlie delta echo")
        writer.write(wire.encode_open(7, {}))
        for off in range(0, len(audio), FRAME):
            writer.write(wire.encode_audio(7, audio[off : off + FRAME].tobytes()))
            await writer.drain()
            await asyncio.sleep(0.003)
        writer.write(wire.encode_end(7))
        decoder, got = wire.Decoder(), []
        while not any(isinstance(m, wire.Final) for m in got):
            got += decoder.feed(await asyncio.wait_for(reader.read(1 << 16), 10))
        writer.close()
        await server.close()
        engine.close()
        return got

    got = asyncio.run(main())
    partials = [m for m in got if isinstance(m, wire.Partial)]
    final = got[-1]
    assert isinstance(final, wire.Final) and final.last
    assert final.text == "alpha bravo charlie delta echo"
    assert partials and any(p.stable > 0 for p in partials)
    stable = ""
    for p in partials:
        assert p.text.startswith(stable)
        stable = p.text[: p.stable]


def test_the_ring_allocates_nothing_per_frame_in_a_running_call():
    """10,000 frames of calls (speech, pauses, finals) through a running stage: the blocks the
    stream core and its shell hold do not grow with the frames (the ring is written in place;
    a request's audio copy lives only until its answer)."""
    import tracemalloc

    import stages.asr.stage as stage_mod
    import stages.asr.stream as stream_mod

    files = (stream_mod.__file__, stage_mod.__file__)
    call = speech("alpha bravo charlie _ delta echo _ _")
    start, stop = s(0.06), s(2.1)

    async def main():
        cfg = ASRConfig()
        engine = ASREngine(WordBackend(), capacity=1, window_ms=0, max_seconds=ring_seconds(cfg))
        stage = StreamingASR(engine, cfg)
        finals = Counter()
        stage.link(finals)  # counts the finals, keeps nothing
        await stage.start(StageContext())
        counts = []
        tracemalloc.start()
        try:
            for k in range(10_000):
                base = (k * FRAME) // len(call) * len(call)
                off = k * FRAME % len(call)
                stage.process(AudioIn(call[off : off + FRAME], offset=base + off), DOWN)
                if off <= start < off + FRAME:
                    stage.process(SpeechStarted(base + start), DOWN)
                if off <= stop < off + FRAME:
                    stage.process(SpeechStopped(base + stop, started_at=base + start), DOWN)
                await idle(lambda: not stage.busy)
                if k + 1 in (1_000, 10_000):
                    snap = tracemalloc.take_snapshot().filter_traces(
                        [tracemalloc.Filter(True, f) for f in files])
                    stats = snap.statistics("filename")
                    counts.append((sum(x.count for x in stats), sum(x.size for x in stats)))
            # a frame into the ring costs no temporary either: the peak over one frame's
            # processing stays under one 20-ms frame as float32 (1,280 B) for 99% of frames
            stage.process(EndOfCall(), DOWN)  # no utterance open: nothing but the ring
            await idle(lambda: not stage.busy)
            quiet = np.zeros(FRAME, np.int16)
            end = 10_000 * FRAME + len(call)
            peaks = []
            for k in range(1_000):
                frame = AudioIn(quiet, offset=end + k * FRAME)
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                stage.process(frame, DOWN)
                peaks.append(tracemalloc.get_traced_memory()[1] - before)
            counts.append(float(np.percentile(peaks, 99)))  # 99%: a stray dict resize aside
        finally:
            tracemalloc.stop()
            await stage.stop()
            engine.close()
        return counts, stage.backend_calls, finals.finals

    (at_1k, at_10k, peak), calls, finals = asyncio.run(main())
    assert peak < FRAME * 4, peak
    assert calls > 300 and finals == 10_000 * FRAME // len(call)  # the calls really ran
    # blocks: no growth with frames (the bytes vary with the last request's audio copy, which
    # the engine's worker holds until its next batch)
    assert at_10k[0] <= at_1k[0] + 8, (at_1k, at_10k)
