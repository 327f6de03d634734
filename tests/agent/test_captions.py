"""agent/captions.py: the JSON, SRT, WebVTT and RTTM writers, read back with real parsers
(``srt``, ``webvtt-py`` in strict mode, ``jsonschema``) and, for RTTM, field by field."""

import html
import json
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import captions
from agent.captions import CaptionSegment, CaptionWord

srt = pytest.importorskip("srt")
webvtt = pytest.importorskip("webvtt")
jsonschema = pytest.importorskip("jsonschema")

TEXT = ("Mister Quilter is the apostle of the middle classes, and we are glad to welcome his "
        "gospel. Then a few more words follow here at the end.")
SEGMENT_SCHEMA = {
    "type": "object",
    "required": ["start", "end", "speaker", "text", "words"],
    "additionalProperties": False,
    "properties": {
        "start": {"type": "number", "minimum": 0},
        "end": {"type": "number", "minimum": 0},
        "speaker": {"type": ["string", "null"]},
        "text": {"type": "string"},
        "words": {"type": "array", "items": {
            "type": "object", "required": ["word", "start", "end"], "additionalProperties": False,
            "properties": {"word": {"type": "string"}, "start": {"type": "number", "minimum": 0},
                           "end": {"type": "number", "minimum": 0}}}},
    },
}
SCHEMA = {
    "type": "object",
    "required": ["file", "duration_s", "text", "speakers", "segments"],
    "additionalProperties": False,
    "properties": {
        "file": {"type": "string"},
        "duration_s": {"type": "number", "minimum": 0},
        "text": {"type": "string"},
        "speakers": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "segments": {"type": "array", "items": SEGMENT_SCHEMA},
    },
}


def timed(text: str, start: float, step: float = 0.4, length: float = 0.3) -> tuple:
    return tuple(CaptionWord(w, round(start + i * step, 3), round(start + i * step + length, 3))
                 for i, w in enumerate(text.split()))


def conversation() -> list[CaptionSegment]:
    """Two speakers, one long timed segment, an untimed one, an overlap, an hour in, text that
    needs escaping, and segments with nothing to show."""
    return [
        CaptionSegment(0.5, 9.9, TEXT, "SPEAKER_1", timed(TEXT, 0.5, step=0.35)),
        CaptionSegment(10.2, 12.0, "No one who is himself honest will doubt my being so.",
                       "SPEAKER_2"),
        CaptionSegment(11.5, 12.5, "Yes & <no> --> maybe", "SPEAKER_1"),
        CaptionSegment(13.0, 13.0, "", "SPEAKER_2"),
        CaptionSegment(14.0, 14.5, "   ", None),
        CaptionSegment(3725.25, 3727.75, "Über die Straße nach 東京 😀", "Dr. Åsa Öberg"),
    ]


def ms(t: timedelta) -> int:
    return round(t.total_seconds() * 1000)


# --- JSON -------------------------------------------------------------------------------------
def test_json_follows_the_schema_and_keeps_everything():
    segs = conversation()
    doc = captions.to_json(segs, file="meeting.wav", duration_s=3728.0)
    jsonschema.validate(doc, SCHEMA)
    assert json.loads(json.dumps(doc)) == doc
    assert doc["speakers"] == ["SPEAKER_1", "SPEAKER_2", "Dr. Åsa Öberg"]
    assert doc["text"].startswith("Mister Quilter") and doc["text"].endswith("東京 😀")
    assert "  " not in doc["text"]
    first = doc["segments"][0]
    assert [w["word"] for w in first["words"]] == TEXT.split()
    assert (first["start"], first["end"], first["words"][1]["start"]) == (0.5, 9.9, 0.85)
    assert doc["segments"][4]["speaker"] is None


def test_json_segments_are_in_time_order_and_times_to_the_millisecond():
    segs = [CaptionSegment(5.0, 6.0, "b", "B"), CaptionSegment(1.23456, 2.0, "a", "A")]
    doc = captions.to_json(segs, file="x", duration_s=6.00049)
    assert [s["text"] for s in doc["segments"]] == ["a", "b"]
    assert doc["segments"][0]["start"] == 1.235 and doc["duration_s"] == 6.0
    assert doc["speakers"] == ["A", "B"]


def test_json_lines_are_one_segment_each():
    for seg in conversation():
        line = captions.json_line(seg)
        assert "\n" not in line
        assert json.loads(line) == captions.segment_dict(seg)
        jsonschema.validate(json.loads(line), SEGMENT_SCHEMA)
    assert "東京" in captions.json_line(conversation()[-1])  # written as itself, not \\u escapes
    tagged = json.loads(captions.json_line(conversation()[0], type="segment", file="a.wav"))
    assert list(tagged)[:2] == ["type", "file"] and tagged["file"] == "a.wav"


# --- SRT --------------------------------------------------------------------------------------
def test_srt_parses_with_speakers_wrapped_lines_and_split_cues():
    out = captions.to_srt(conversation())
    subs = list(srt.parse(out))
    assert [s.index for s in subs] == list(range(1, len(subs) + 1))
    assert all(ms(a.start) <= ms(b.start) for a, b in zip(subs, subs[1:], strict=False))
    for s in subs:
        lines = s.content.split("\n")
        assert 1 <= len(lines) <= captions.CUE_LINES
        assert all(len(line) <= captions.LINE_CHARS for line in lines), lines
        assert ms(s.start) <= ms(s.end)
    # the long timed segment became several cues, cut between words and timed by them
    first = [s for s in subs if s.content.startswith("SPEAKER_1: ") and ms(s.start) < 10_000]
    assert len(first) >= 3
    words = list(conversation()[0].words)
    for s in first:
        said = s.content.removeprefix("SPEAKER_1: ").split()
        mine, words = words[: len(said)], words[len(said) :]
        assert said == [w.text for w in mine]
        assert (ms(s.start), ms(s.end)) == (round(mine[0].start * 1000), round(mine[-1].end * 1000))
    assert words == []  # every word, in order, once


def test_srt_cues_break_after_a_sentence_or_clause_when_one_is_near():
    subs = list(srt.parse(captions.to_srt(conversation()[:1])))
    ends = [s.content.split()[-1] for s in subs[:-1]]
    assert all(e.endswith((".", ",")) for e in ends), ends


def test_srt_edge_cases():
    subs = list(srt.parse(captions.to_srt(conversation())))
    texts = [s.content for s in subs]
    # nothing to show makes no cue: the empty and the blank segment are gone
    assert not any(t.strip() in ("", "SPEAKER_2:") for t in texts)
    assert "SPEAKER_1: Yes & <no> -> maybe" in texts  # no escapes in SRT: the arrow is defused
    last = subs[-1]
    assert last.content == "Dr. Åsa Öberg: Über die Straße nach 東京 😀"
    assert (ms(last.start), ms(last.end)) == (3_725_250, 3_727_750)
    assert "01:02:05,250 --> 01:02:07,750" in captions.to_srt(conversation())


# --- WebVTT -----------------------------------------------------------------------------------
def test_vtt_parses_strictly_with_voices_and_escapes():
    out = captions.to_vtt(conversation())
    assert out.startswith("WEBVTT\n\n")
    vtt = webvtt.from_string(out, strict=True)
    cues = vtt.captions
    assert len(cues) == len(list(srt.parse(captions.to_srt(conversation()))))
    assert [c.voice for c in cues[:3]] == ["SPEAKER_1"] * 3
    tricky = [c for c in cues if "maybe" in c.raw_text]
    assert len(tricky) == 1
    assert tricky[0].raw_text == "<v SPEAKER_1>Yes &amp; &lt;no&gt; --&gt; maybe"
    assert html.unescape(tricky[0].text) == "Yes & <no> --> maybe"
    last = cues[-1]
    assert html.unescape(last.voice) == "Dr. Åsa Öberg"
    assert (last.start, last.end) == ("01:02:05.250", "01:02:07.750")
    assert all(c.start_time.in_milliseconds() <= c.end_time.in_milliseconds() for c in cues)
    assert [c.identifier for c in cues] == [str(i) for i in range(1, len(cues) + 1)]


def test_vtt_voice_names_are_escaped_too():
    seg = CaptionSegment(0.0, 1.0, "hi", "A&B <boss>")
    (cue,) = webvtt.from_string(captions.to_vtt([seg]), strict=True).captions
    assert html.unescape(cue.voice) == "A&B <boss>" and cue.text == "hi"


def test_zero_length_words_and_an_empty_transcript():
    words = (CaptionWord("one", 1.0, 1.0), CaptionWord("two", 1.0, 1.0), CaptionWord("", 1.0, 2.0))
    seg = CaptionSegment(0.8, 1.5, "one two", "S", words)
    (sub,) = srt.parse(captions.to_srt([seg]))
    assert sub.content == "S: one two" and ms(sub.start) == ms(sub.end) == 1000
    (cue,) = webvtt.from_string(captions.to_vtt([seg]), strict=True).captions
    assert cue.start == cue.end == "00:00:01.000"
    assert captions.to_srt([]) == ""
    assert captions.to_vtt([]) == "WEBVTT\n"
    assert list(webvtt.from_string(captions.to_vtt([]), strict=True).captions) == []
    assert captions.to_rttm([], "f") == ""
    assert captions.to_json([], file="f", duration_s=0.0)["segments"] == []


def test_line_breaks_inside_the_text_never_end_a_cue():
    words = (CaptionWord("one\n\ntwo", 0.0, 0.5), CaptionWord("three", 0.5, 1.0))
    segs = [CaptionSegment(0.0, 1.0, "x", "S", words),
            CaptionSegment(2.0, 3.0, "four\n\nfive\r\nsix", "A\nB")]
    assert [s.content for s in srt.parse(captions.to_srt(segs))] == [
        "S: one two three", "A B: four five six"]
    cues = webvtt.from_string(captions.to_vtt(segs), strict=True).captions
    assert [(c.voice, c.text) for c in cues] == [("S", "one two three"), ("A B", "four five six")]


def test_a_word_longer_than_a_line_gets_a_line_of_its_own():
    long = "x" * 60
    seg = CaptionSegment(0.0, 4.0, f"see {long} here and there", None)
    lines = [line for s in srt.parse(captions.to_srt([seg])) for line in s.content.split("\n")]
    assert long in lines and all(len(line) <= captions.LINE_CHARS for line in lines if line != long)


def test_timed_cues_end_at_a_pause_and_last_at_most_seven_seconds():
    words = (*timed("one two three", 0.0), *timed("four five", 5.0),
             *timed(" ".join(["w"] * 12), 8.0, step=0.9))  # short words, 11 s of them
    seg = CaptionSegment(0.0, 20.0, " ".join(w.text for w in words), "S", words)
    subs = list(srt.parse(captions.to_srt([seg])))
    assert subs[0].content == "S: one two three" and subs[1].content == "S: four five"
    assert all(ms(s.end) - ms(s.start) <= 7000 for s in subs)
    assert sum(len(s.content.split()) - 1 for s in subs) == len(words)


alphabet = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp"))
word = st.text(alphabet, min_size=1, max_size=12).filter(lambda w: not w.isspace())
segment = st.builds(
    lambda words, start, length, who: CaptionSegment(
        start, start + length, " ".join(words), who, timed(" ".join(words), start, 0.3, 0.2)
        if length > 0.5 else ()),
    st.lists(word, min_size=0, max_size=30),
    st.floats(0, 10_000, allow_nan=False), st.floats(0, 30, allow_nan=False),
    st.one_of(st.none(), st.text(alphabet, min_size=1, max_size=20)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(segment, max_size=6))
def test_any_transcript_parses_in_both_formats_and_keeps_its_words(segs):
    subs = list(srt.parse(captions.to_srt(segs)))
    cues = webvtt.from_string(captions.to_vtt(segs), strict=True).captions
    expected = captions.cues(segs)
    assert len(subs) == len(cues) == len(expected)
    for sub, cue, want in zip(subs, cues, expected, strict=True):
        assert ms(sub.start) == cue.start_time.in_milliseconds() == max(0, round(want.start * 1000))
        body = "\n".join(want.lines)
        assert html.unescape(cue.text) == body
        prefix = f"{want.speaker}: " if want.speaker else ""
        assert sub.content == (prefix + body).replace("-->", "->")
        if want.speaker:
            assert html.unescape(cue.voice) == want.speaker


# --- RTTM -------------------------------------------------------------------------------------
def parse_rttm(text: str) -> list[tuple[str, str, float, float]]:
    turns = []
    for line in text.splitlines():
        f = line.split(" ")
        assert len(f) == 10 and f[0] == "SPEAKER" and f[2] == "1", line
        assert f[5] == f[6] == f[8] == f[9] == "<NA>"
        assert float(f[4]) > 0
        turns.append((f[1], f[7], float(f[3]), round(float(f[3]) + float(f[4]), 3)))
    return turns


def test_rttm_is_one_line_per_turn_and_round_trips():
    segs = conversation() + [
        CaptionSegment(12.6, 13.5, "and more", "SPEAKER_1"),  # 0.1 s after its last: one turn
        CaptionSegment(20.0, 21.0, "later", "SPEAKER_1"),  # after a long pause: a new turn
    ]
    got = parse_rttm(captions.to_rttm(segs, "my meeting"))
    assert {f for f, *_ in got} == {"my_meeting"}
    assert [(who, a, b) for _, who, a, b in got] == [
        ("SPEAKER_1", 0.5, 9.9), ("SPEAKER_2", 10.2, 12.0), ("SPEAKER_1", 11.5, 13.5),
        ("unknown", 14.0, 14.5), ("SPEAKER_1", 20.0, 21.0), ("Dr._Åsa_Öberg", 3725.25, 3727.75)]
    assert [(w, round(a, 3), round(b, 3)) for w, a, b in captions.turns(segs)] == [
        (who, a, b) for _, who, a, b in got]


def test_rttm_does_not_merge_a_speaker_over_someone_else():
    segs = [CaptionSegment(0.0, 2.0, "a", "A"), CaptionSegment(2.1, 2.3, "b", "B"),
            CaptionSegment(2.4, 4.0, "a again", "A"), CaptionSegment(4.1, 5.0, "a more", "A")]
    got = [(who, a, b) for _, who, a, b in parse_rttm(captions.to_rttm(segs, "f"))]
    assert got == [("A", 0.0, 2.0), ("B", 2.1, 2.3), ("A", 2.4, 5.0)]


def test_rttm_overlapping_segments_of_one_speaker_are_one_turn():
    segs = [CaptionSegment(0.0, 3.0, "x", "A"), CaptionSegment(1.0, 2.0, "y", "A"),
            CaptionSegment(2.5, 6.0, "z", "A"), CaptionSegment(1.5, 2.5, "w", "B")]
    got = [(who, a, b) for _, who, a, b in parse_rttm(captions.to_rttm(segs, "f"))]
    assert got == [("A", 0.0, 6.0), ("B", 1.5, 2.5)]
