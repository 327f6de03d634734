"""voxline's STT service in real pipecat pipelines (the installed pipecat-ai, its VADProcessor and
Silero model): real speech in, pipecat's transcription frames out — from the process's shared
engine and from ``voxline asr-serve`` — two pipelines batched in one engine, and every slot
given back when its pipeline ends."""

import asyncio

import numpy as np
import pytest
import speech
from asr_serve import Served
from pipecat_pipeline import VAD_STOP_S, Played, play

from agent.config import ASRConfig, VADConfig
from stages.adapters.pipecat_stt import (
    TTFS_P99_S,
    VoxlineSTTService,
    VoxlineTranscript,
    shared_engine,
)
from stages.asr.stream import END_PAD_MS
from stages.asr.wer import corpus_wer

pytestmark = pytest.mark.slow

MAX_WER = 0.15  # the clips come out word for word here (tests/speech.py); 0.15 is a word or two
CALL = ("kittens", "honest", "quilter")  # three turns with 1.5-s pauses: three utterances


def call_audio(names: tuple[str, ...] = CALL) -> tuple[np.ndarray, str]:
    lead = np.zeros(8000, np.int16)
    pcm, ref = speech.joined(names, gap_s=1.5, tail_s=1.5)
    return np.concatenate([lead, pcm]), ref


def check_transcripts(played: Played, ref: str) -> None:
    """Close to the reference; one finalized frame per utterance; partials whose stable
    prefixes never move back within an utterance; results carry the audio they cover."""
    assert not played.errors, [e.error for e in played.errors]
    assert corpus_wer([(ref, played.text)]) <= MAX_WER, (played.text, ref)
    finals = played.finals
    assert len(finals) >= 3 and all(f.finalized for f in finals)
    assert played.interims, "no partials while the caller spoke"
    last: VoxlineTranscript | None = None
    for _, frame in played.frames:
        r = frame.result
        assert isinstance(r, VoxlineTranscript) and r.text == frame.text and r.end_s > r.start_s
        if r.final:
            last = None
            continue
        if last is not None and r.start_s == last.start_s:
            assert r.text.startswith(last.stable_text), (last, r)
        last = r
    ends = [f.result.end_s for f in finals]
    assert ends == sorted(ends)


def test_a_pipecat_pipeline_transcribes_real_speech_in_the_shared_engine():
    pcm, ref = call_audio()
    stt = VoxlineSTTService()

    async def during() -> None:
        assert stt.holds_slot and stt.engine is shared_engine()
        assert stt.engine.pool.in_use >= 1

    played = asyncio.run(play(stt, pcm, after_audio=during))
    check_transcripts(played, ref)
    assert stt.partials >= 3  # what interim_results=False saves (the next test)
    assert not stt.holds_slot and shared_engine().pool.in_use == 0
    # from the VAD's decision (speech end + stop_secs) to the final, against what it declares
    lags = []
    for f in played.finals:
        arrived = next(t for t, g in played.frames if g is f)
        decided = played.fed_at + f.result.end_s - END_PAD_MS / 1000 + VAD_STOP_S
        lags.append(arrived - decided)
    print(f"VAD stop to final: {[round(x, 3) for x in lags]} s; declared p99 {TTFS_P99_S} s")


def test_without_interim_results_no_partial_is_computed_and_the_finals_still_come():
    pcm, ref = speech.joined(("kittens", "honest"), gap_s=1.5, tail_s=1.5)
    stt = VoxlineSTTService(interim_results=False)
    played = asyncio.run(play(stt, np.concatenate([np.zeros(8000, np.int16), pcm])))
    assert not played.errors, [e.error for e in played.errors]
    assert not played.interims and stt.partials == 0
    assert len(played.finals) >= 2 and all(f.finalized for f in played.finals)
    assert corpus_wer([(ref, played.text)]) <= MAX_WER, (played.text, ref)
    # the pauses' transcripts, not pushed as interim frames, still stand for the finals
    assert stt.pauses_transcribed >= 2 and stt.speculative_finals >= 1


def final_lags(played: Played) -> list[float]:
    """Seconds from the end of the audio each final covers to its arrival."""
    return [round(next(t for t, g in played.frames if g is f) - played.fed_at - f.result.end_s, 3)
            for f in played.finals]


def test_the_final_is_the_transcript_asked_at_voxline_s_pause_before_pipecat_s_stop():
    pcm, ref = call_audio()
    on, off = VoxlineSTTService(), VoxlineSTTService(pauses=False)
    listening: list[bool] = []

    async def during(stt: VoxlineSTTService) -> None:
        listening.append(stt.listens_for_pauses)

    played_on = asyncio.run(play(on, pcm, after_audio=lambda: during(on)))
    played_off = asyncio.run(play(off, pcm, after_audio=lambda: during(off)))
    check_transcripts(played_on, ref)
    check_transcripts(played_off, ref)
    assert listening == [True, False] and not on.listens_for_pauses  # its VAD went with the run
    assert on.pauses_transcribed >= 3
    # the utterances' finals needed no model call after pipecat's stop: they were on their way
    assert on.speculative_finals >= 2, (on.speculative_finals, final_lags(played_on))
    assert off.pauses_transcribed == off.speculative_finals == off.adopted_partials == 0
    print(f"end of audio to final: pauses {final_lags(played_on)} s, "
          f"without {final_lags(played_off)} s; partials adopted {on.adopted_partials}")


def test_a_pause_the_caller_goes_on_after_loses_none_of_the_words():
    # ~0.5 s between the sentences (the first clip's own quiet end, then 0.2 s): voxline's VAD
    # pauses there, pipecat's VAD, told to stop after 2 s of silence, goes on
    pcm, ref = speech.joined(("kittens", "honest"), gap_s=0.2, tail_s=2.5)
    stt = VoxlineSTTService()
    played = asyncio.run(play(stt, np.concatenate([np.zeros(8000, np.int16), pcm]),
                              vad_stop_secs=2.0))
    assert not played.errors, [e.error for e in played.errors]
    assert len(played.finals) == 1 and played.finals[0].finalized
    assert corpus_wer([(ref, played.text)]) <= MAX_WER, (played.text, ref)
    assert stt.pauses_transcribed >= 2  # the gap's pause, then the end's
    # the end's pause read the whole utterance (the gap's transcript was out of date once the
    # caller went on): it is the final
    assert stt.speculative_finals == 1


def test_the_pauses_vad_takes_the_settings_it_is_given():
    # speech must last a minute before this VAD starts an utterance: it hears no pause, and the
    # finals come at pipecat's stops as without pauses
    pcm, ref = speech.joined(("kittens", "honest"), gap_s=1.0, tail_s=1.5)
    stt = VoxlineSTTService(pause_vad=VADConfig(start_ms=60_000))
    listening: list[bool] = []

    async def during() -> None:
        listening.append(stt.listens_for_pauses)

    played = asyncio.run(play(stt, np.concatenate([np.zeros(8000, np.int16), pcm]),
                              after_audio=during))
    assert listening == [True]
    assert stt.pauses_transcribed == stt.speculative_finals == 0
    assert corpus_wer([(ref, played.text)]) <= MAX_WER, (played.text, ref)


def test_a_pipecat_pipeline_transcribes_real_speech_through_asr_serve(tmp_path):
    served = Served(tmp_path, "--asr-slots", "1")
    try:
        pcm, ref = call_audio()
        stt = VoxlineSTTService(socket_path=served.path)
        check_transcripts(asyncio.run(play(stt, pcm)), ref)
        assert not stt.holds_slot
        # one slot on the server: a second pipeline is served only if the first gave it back
        # (and asks for no partials: the server sends none)
        again = asyncio.run(play(VoxlineSTTService(socket_path=served.path, interim_results=False),
                                 np.concatenate([np.zeros(8000, np.int16), speech.load("wizard"),
                                                 np.zeros(24000, np.int16)])))
        assert not again.errors, [e.error for e in again.errors]
        assert not again.interims and again.finals
        assert corpus_wer([(speech.text("wizard"), again.text)]) <= MAX_WER, again.text
    finally:
        assert served.stop() == 0


def test_two_pipelines_in_one_process_share_one_engine_and_its_batches():
    # one lane and a 60-ms window: the two callers' requests, made at the same moments, meet
    cfg = ASRConfig(workers=1, max_batch=4, window_ms=60.0)
    a, b = VoxlineSTTService(asr_config=cfg), VoxlineSTTService(asr_config=cfg)
    short, ref_short = call_audio(("kittens",))
    long, ref_long = call_audio(("kittens", "quilter"))
    engine = shared_engine(cfg)
    before = dict(engine.stats.batch_sizes)
    in_use: list[int] = []

    async def both() -> tuple[Played, Played]:
        async def a_done() -> None:
            in_use.append(engine.pool.in_use)  # both pipelines hold a slot

        first = asyncio.create_task(play(a, short, after_audio=a_done))
        second = asyncio.create_task(play(b, long))
        played_a = await first
        await asyncio.sleep(0.2)
        in_use.append(engine.pool.in_use)  # the first ended: its slot is back
        return played_a, await second

    played_a, played_b = asyncio.run(both())
    assert a.engine is b.engine is engine
    assert corpus_wer([(ref_short, played_a.text)]) <= MAX_WER, played_a.text
    assert corpus_wer([(ref_long, played_b.text)]) <= MAX_WER, played_b.text
    # each stream has at most one model call out at a time, so a batch of two carried both
    shared = engine.stats.batch_sizes.get(2, 0) - before.get(2, 0)
    assert shared >= 1, engine.stats.batch_sizes
    assert in_use == [2, 1]
    assert engine.pool.in_use == 0
