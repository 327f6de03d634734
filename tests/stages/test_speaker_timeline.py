"""Tests for stages/speaker/timeline.py: where a change between labelled windows lands, how
short flips are smoothed, and the renumbering by first appearance."""

from __future__ import annotations

from stages.speaker.timeline import FRAME, SpeakerTurn, first_appearance, region_turns

SR = 16_000


def _windows(start: int, labels: list[int], window: int = 24_000, step: int = 12_000):
    return [(start + i * step, start + i * step + window, s) for i, s in enumerate(labels)]


def test_a_change_falls_between_the_centres_of_differing_windows():
    # windows at 0, 0.75, 1.5, 2.25 s (1.5 s long); the change is between the 2nd and 3rd
    wins = _windows(SR, [0, 0, 1, 1])
    turns = region_turns(SR, SR + 3 * 12_000 + 24_000, wins, 2, min_turn=SR // 2)
    assert [t.speaker for t in turns] == [0, 1]
    centre2, centre3 = SR + 12_000 + 12_000, SR + 24_000 + 12_000
    assert abs(turns[0].end - (centre2 + centre3) / 2) <= FRAME
    assert turns[0].start == SR and turns[-1].end == SR + 60_000
    assert turns[0].end == turns[1].start


def test_turns_cover_the_region_exactly_when_it_is_not_a_whole_number_of_frames():
    turns = region_turns(1_000, 1_000 + 20_001, [(1_000, 21_001, 3)], 4, min_turn=SR // 2)
    assert turns == [SpeakerTurn(1_000, 21_001, 3)]


def test_a_flip_shorter_than_the_minimum_turn_goes_to_a_neighbour():
    # one window of speaker 1 among speaker 0's: its winning stretch is ~0.75 s
    wins = _windows(0, [0, 0, 0, 1, 0, 0, 0])
    end = 6 * 12_000 + 24_000
    assert len(region_turns(0, end, wins, 2, min_turn=SR)) == 1
    kept = region_turns(0, end, wins, 2, min_turn=SR // 4)
    assert [t.speaker for t in kept] == [0, 1, 0]


def test_a_short_region_keeps_its_one_speaker():
    assert region_turns(0, 3_000, [(0, 3_000, 1)], 2, min_turn=SR) == [SpeakerTurn(0, 3_000, 1)]


def test_speakers_are_renumbered_in_order_of_first_speech():
    turns = [
        SpeakerTurn(0, 10, 4),
        SpeakerTurn(10, 20, 2),
        SpeakerTurn(30, 40, 4),
        SpeakerTurn(40, 50, 0),
    ]
    assert [t.speaker for t in first_appearance(turns)] == [0, 1, 0, 2]
