"""Speakers on a transcript: channels interleaved in time, and chunks split at the speaker
changes their words fall on."""

from dataclasses import dataclass

from stages.asr.backend import Word
from stages.asr.cutting import Segment
from stages.asr.speakers import assign_speakers, interleave_channels

R = 16_000


@dataclass
class T:
    start: int
    end: int
    speaker: int


def seg(text: str, a: float, b: float, words=()) -> Segment:
    return Segment(text, int(a * R), int(b * R), tuple(words))


def test_channels_interleave_in_time_each_on_its_own_speaker():
    caller = [seg("hello there", 0.5, 1.5), seg("yes please", 4.0, 5.0)]
    agent = [seg("hi how can I help", 2.0, 3.5), seg("", 3.6, 3.7)]
    out = interleave_channels([caller, agent])
    assert [(s.speaker, s.text) for s in out] == [(0, "hello there"), (1, "hi how can I help"),
                                                 (0, "yes please")]


def test_the_channel_is_the_speaker_whoever_talks_first():
    out = interleave_channels([[seg("caller", 3.0, 4.0)], [seg("the agent's greeting", 0.2, 2.0)]])
    assert [(s.speaker, s.text) for s in out] == [(1, "the agent's greeting"), (0, "caller")]


def test_a_chunk_is_split_where_its_words_change_speaker():
    words = [Word("one", 0.1, 0.4), Word("two", 0.5, 0.9), Word("three", 1.3, 1.7),
             Word("four", 1.8, 2.2)]
    turns = [T(0, int(1.1 * R), 7), T(int(1.1 * R), int(2.5 * R), 3)]
    out = assign_speakers([seg("one two three four", 0.0, 2.4, words)], turns)
    assert [(s.speaker, s.text) for s in out] == [(0, "one two"), (1, "three four")]
    assert out[0].end <= out[1].start and out[0].start >= 0.0 and out[1].end <= 2.4


def test_a_word_outside_every_turn_goes_to_the_nearest_and_runs_merge():
    words = [Word("a", 0.0, 0.2), Word("b", 3.0, 3.2)]
    turns = [T(int(0.5 * R), R, 1)]
    out = assign_speakers([seg("a", 0.0, 0.3, words[:1]), seg("b", 2.9, 3.3, words[1:])], turns)
    assert [(s.speaker, s.text) for s in out] == [(0, "a"), (0, "b")]  # > 1 s apart: two


def test_a_chunk_without_word_times_goes_to_who_talks_most_of_it():
    turns = [T(0, R, 0), T(R, 4 * R, 1)]
    out = assign_speakers([seg("mostly the second", 0.5, 3.0)], turns)
    assert [(s.speaker, s.text) for s in out] == [(0, "mostly the second")]  # renumbered
    assert assign_speakers([seg("no turns", 0.0, 1.0)], []) [0].speaker == 0
