"""The asyncio client of asr-serve's streaming protocol against a real ``voxline asr-serve``
with the real model: a caller's words survive the server being killed and restarted mid-
utterance, a server that is not up yet, and a server with no free slot — each outage reported
once, and the finals owed arriving late rather than never."""

import asyncio
import time

import numpy as np
import pytest
import speech
from asr_serve import Served

from stages.asr.stream import Kind, Result
from stages.asr.stream_client import ServedStream
from stages.asr.wer import corpus_wer

pytestmark = pytest.mark.slow

RATE = 16_000
FRAME = 320
MAX_WER = 0.15
LEAD = 8000


class Caller:
    """One ServedStream and what came back on it."""

    def __init__(self, path: str) -> None:
        self.results: list[Result] = []
        self.errors: list[str] = []
        self.recovered = 0
        self.final = asyncio.Event()
        self.stream = ServedStream(self._result, self.errors.append, socket_path=path,
                                   on_recovered=self._recovered)

    def _result(self, r: Result) -> None:
        self.results.append(r)
        if r.kind is Kind.FINAL:
            self.final.set()

    def _recovered(self) -> None:
        self.recovered += 1

    async def done(self) -> None:
        """The utterance's final is in; then the stream ends."""
        await asyncio.wait_for(self.final.wait(), 120)
        await self.stream.finish()

    @property
    def text(self) -> str:
        return " ".join(r.text for r in self.results if r.final)

    async def say(self, name: str, during=None, stop: bool = True) -> None:  # noqa: ANN001
        """The clip after half a second of silence, in real time, with the VAD's events at the
        clip's edges (``stop``: its end too); ``during(seconds_in)`` is awaited after each
        frame."""
        pcm = np.concatenate([np.zeros(LEAD, np.int16), speech.load(name)])
        base = self.stream.heard
        t0 = time.monotonic()
        for i in range(0, len(pcm) - FRAME + 1, FRAME):
            self.stream.audio(pcm[i:i + FRAME].tobytes())
            if i == LEAD + 3200:
                self.stream.started(base + LEAD)  # the VAD decides 200 ms in
            if during is not None:
                await during((i + FRAME) / RATE)
            await asyncio.sleep(max(0.0, t0 + (i + FRAME) / RATE - time.monotonic()))
        if stop:
            self.stream.stopped(base + len(pcm), base + LEAD)


def run_stopping(main, servers):  # noqa: ANN001, ANN201
    """``asyncio.run(main())``, then every server ``servers()`` names is stopped."""
    try:
        return asyncio.run(main())
    finally:
        for s in servers():
            s.stop()


def test_a_server_killed_and_restarted_mid_utterance_loses_no_words(tmp_path):
    served = Served(tmp_path)
    path = served.path
    restarted: list[Served] = []

    async def main() -> Caller:
        caller = Caller(path)
        await caller.stream.open()
        assert caller.stream.served

        async def during(s: float) -> None:
            if s >= 2.0 and not restarted and served.proc.poll() is None:
                served.kill()  # SIGKILL 1.5 s into the words: no goodbye
            elif s >= 2.5 and not restarted:
                restarted.append(None)  # started in the background; the audio goes on
                asyncio.get_running_loop().run_in_executor(
                    None, lambda: restarted.__setitem__(0, Served(tmp_path, socket_path=path)))

        await caller.say("quilter", during)
        await caller.done()
        return caller

    caller = run_stopping(main, lambda: [served, *[r for r in restarted if r is not None]])
    assert corpus_wer([(speech.text("quilter"), caller.text)]) <= MAX_WER, caller.text
    assert len(caller.errors) == 1 and "asr-serve" in caller.errors[0], caller.errors
    assert caller.recovered == 1 and caller.stream.reconnects >= 1
    finals = [r for r in caller.results if r.kind is Kind.FINAL]
    assert len(finals) == 1 and finals[0].start <= LEAD and finals[0].end >= LEAD + 16_000 * 5


def test_a_pause_heard_while_the_server_was_away_is_told_to_the_new_stream(tmp_path):
    # the caller stops talking while asr-serve is down: once it is back, the utterance is
    # transcribed up to the pause at once (as a speculative result), before any stop
    served = Served(tmp_path)
    path = served.path
    servers = [served]

    async def main() -> tuple[Caller, list[Result]]:
        caller = Caller(path)
        await caller.stream.open()
        await caller.say("kittens", stop=False)
        served.kill()
        voice_end = caller.stream.heard
        silence = np.zeros(FRAME, np.int16).tobytes()
        for _ in range(5):  # 100 ms of silence, then the VAD's pause
            caller.stream.audio(silence)
            await asyncio.sleep(FRAME / RATE)
        caller.stream.paused(caller.stream.heard, voice_end)
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: servers.append(Served(tmp_path, socket_path=path)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                r.kind is Kind.SPECULATIVE for r in caller.results):
            caller.stream.audio(silence)
            await asyncio.sleep(FRAME / RATE)
        early = list(caller.results)
        caller.stream.stopped(caller.stream.heard, LEAD)
        await caller.done()
        return caller, early

    caller, early = run_stopping(main, lambda: servers)
    assert caller.recovered == 1
    spec = [r for r in early if r.kind is Kind.SPECULATIVE]
    assert spec, [(r.kind, r.text) for r in early]
    assert corpus_wer([(speech.text("kittens"), spec[-1].text)]) <= MAX_WER, spec[-1].text
    assert corpus_wer([(speech.text("kittens"), caller.text)]) <= MAX_WER, caller.text


def test_a_server_not_up_yet_gets_the_audio_kept_for_it(tmp_path):
    path = str(tmp_path / "asr.sock")
    servers: list[Served] = []

    async def main() -> Caller:
        caller = Caller(path)
        await caller.stream.open()  # nobody there: reported, tried again in the background
        assert not caller.stream.served and caller.errors
        starting = asyncio.get_running_loop().run_in_executor(
            None, lambda: servers.append(Served(tmp_path, socket_path=path)))
        await caller.say("kittens")
        await starting
        await caller.done()
        return caller

    caller = run_stopping(main, lambda: servers)
    assert corpus_wer([(speech.text("kittens"), caller.text)]) <= MAX_WER, caller.text
    assert len(caller.errors) == 1 and "cannot reach asr-serve" in caller.errors[0]


def test_a_stream_refused_for_want_of_a_slot_is_served_once_one_is_free(tmp_path):
    served = Served(tmp_path, "--asr-slots", "2", "--max-streams-per-connection", "1")

    async def main() -> tuple[Caller, Caller, Caller]:
        a, b, c = Caller(served.path), Caller(served.path), Caller(served.path)
        await a.stream.open()
        await b.stream.open()
        await asyncio.sleep(0.3)
        await c.stream.open()  # the third: no slot left on the server
        late = asyncio.create_task(c.say("honest"))
        await asyncio.gather(a.say("kittens"), b.say("kittens"))
        await asyncio.wait_for(a.final.wait(), 60)
        await a.stream.finish()  # a slot comes free
        await late
        await asyncio.wait_for(c.final.wait(), 60)
        await asyncio.gather(b.stream.finish(), c.stream.finish())
        return a, b, c

    a, b, c = run_stopping(main, lambda: [served])
    assert corpus_wer([(speech.text("kittens"), a.text)]) <= MAX_WER, a.text
    assert c.errors and "no room" in c.errors[0], c.errors
    assert corpus_wer([(speech.text("honest"), c.text)]) <= MAX_WER, c.text
