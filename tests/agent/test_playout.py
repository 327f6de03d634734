import numpy as np

from agent.frames import BotStartedSpeaking, BotStoppedSpeaking, HeardText, Interrupt, TTSAudio
from agent.playout import Playout
from agent.trace import Trace


def test_pull_frames_speaking_state_and_audio_out():
    ups = []
    tr = Trace()
    tr.begin_turn(speech_end=1)
    po = Playout(ups.append, tr)
    assert po.pull() is None and po.idle
    po.on_frame(TTSAudio(np.arange(500, dtype=np.int16)))
    po.on_frame(TTSAudio(np.arange(500, 700, dtype=np.int16), last=True))
    a = po.pull()
    po.sent(123)
    assert np.array_equal(a, np.arange(320, dtype=np.int16))
    assert isinstance(ups[0], BotStartedSpeaking) and tr.turns[0]["events_ms"]["audio_out"] is not None
    b = po.pull()
    assert np.array_equal(b, np.arange(320, 640, dtype=np.int16))
    c = po.pull()  # 60 samples left, zero padded
    assert np.array_equal(c[:60], np.arange(640, 700)) and not c[60:].any()
    assert po.pull() is None and isinstance(ups[-1], BotStoppedSpeaking) and po.idle


def test_interrupt_flushes_within_one_frame():
    ups = []
    po = Playout(ups.append)
    po.on_frame(TTSAudio(np.ones(16000, dtype=np.int16)))
    assert po.pull() is not None
    po.on_frame(Interrupt())
    assert po.pull() is None and po.queued_samples == 0
    stopped = [f for f in ups if isinstance(f, BotStoppedSpeaking)]
    assert len(stopped) == 1 and stopped[0].interrupted and po.interruptions == 1
    assert isinstance(ups[-1], HeardText) and ups[-1].heard == ()  # (no text was being played)


def test_queue_is_bounded():
    po = Playout(lambda f: None, max_seconds=1.0)
    for _ in range(5):
        po.write(np.ones(8000, dtype=np.int16))
    assert po.queued_samples == 16000 and po.dropped_samples == 24000


def test_a_reply_whose_audio_runs_out_before_its_next_text_counts_a_gap():
    from agent.frames import TextToSpeak

    po = Playout(lambda f: None)
    po.on_frame(TextToSpeak("Sure,", reply=7))
    po.on_frame(TTSAudio(np.ones(640, dtype=np.int16), last=True))
    assert po.pull() is not None and po.pull() is not None
    for _ in range(3):  # the next chunk is late: three frames of silence inside the reply
        assert po.pull() is None
    po.on_frame(TextToSpeak("I can help with that.", reply=7))
    po.on_frame(TTSAudio(np.ones(640, dtype=np.int16), last=True))
    assert po.pull() is not None
    assert (po.gaps, po.gap_samples) == (1, 3 * 320)
    # Another reply after a silence is a new message, not a gap; nor is audio that keeps up.
    po.pull(), po.pull(), po.pull()
    po.on_frame(TextToSpeak("Anything else?", reply=8))
    po.on_frame(TTSAudio(np.ones(640, dtype=np.int16)))
    po.on_frame(TextToSpeak("Just ask.", reply=8))
    po.on_frame(TTSAudio(np.ones(640, dtype=np.int16), last=True))
    while po.pull() is not None:
        pass
    assert po.gaps == 1
