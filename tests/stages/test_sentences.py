"""Sentence aggregation: LLM deltas in, speakable chunks out."""

from __future__ import annotations

import pytest

from stages.llm.sentences import RepeatWatch, SentenceAggregator


def run(deltas: list[str], min_words: int = 3) -> list[str]:
    agg = SentenceAggregator(min_words)
    out: list[str] = []
    for d in deltas:
        out.extend(agg.feed(d))
    rest = agg.flush()
    if rest:
        out.append(rest)
    return out


def by_char(text: str, min_words: int = 3) -> list[str]:
    return run(list(text), min_words)


def test_sentences_split_at_terminators() -> None:
    assert by_char("Hello there. How are you? Great!") == ["Hello there.", "How are you?", "Great!"]


def test_a_chunk_is_released_as_soon_as_the_next_character_decides_it() -> None:
    agg = SentenceAggregator(3)
    assert agg.feed("It is sunny today.") == []  # "." could still become "3.5"-style
    assert agg.feed(" And") == ["It is sunny today."]
    assert agg.flush() == "And"


def test_first_chunk_may_end_at_a_clause_once_it_has_enough_words() -> None:
    text = "Well, I think that, on balance, it will rain. Later, it clears."
    assert by_char(text, 3) == [
        "Well, I think that,",
        "on balance, it will rain.",
        "Later, it clears.",
    ]


def test_clause_too_short_is_not_cut() -> None:
    assert by_char("Sure, I can do that; just a moment.", 3) == [
        "Sure, I can do that;",
        "just a moment.",
    ]
    assert by_char("Sure, I can do that; just a moment.", 10) == [
        "Sure, I can do that; just a moment."
    ]


def test_only_the_first_chunk_is_cut_at_clauses() -> None:
    chunks = by_char("Yes. Well, I think so, but it depends: maybe.", 1)
    assert chunks == ["Yes.", "Well, I think so, but it depends: maybe."]


def test_dashes_are_clause_boundaries_but_hyphens_are_not() -> None:
    assert by_char("Let me check — one moment please.", 2) == [
        "Let me check —",
        "one moment please.",
    ]
    assert by_char("A well-known fact - really true.", 3) == ["A well-known fact -", "really true."]
    assert by_char("A well-known state-of-the-art fact.", 1) == [
        "A well-known state-of-the-art fact."
    ]


def test_abbreviations_and_initials_do_not_end_sentences() -> None:
    text = "Mr. Smith met Dr. Jones, e.g. at J. R. Tolkien's house. Then they left."
    assert by_char(text, 50) == [
        "Mr. Smith met Dr. Jones, e.g. at J. R. Tolkien's house.",
        "Then they left.",
    ]


def test_decimals_numbers_and_urls_do_not_end_sentences() -> None:
    text = "It costs 3.5 dollars, or 1,000 yen at example.com today. Okay?"
    assert by_char(text, 50) == [
        "It costs 3.5 dollars, or 1,000 yen at example.com today.",
        "Okay?",
    ]


def test_closing_quotes_and_repeated_marks_stay_with_their_sentence() -> None:
    assert by_char('He said "stop!" Then "go?!" Fine...') == [
        'He said "stop!"',
        'Then "go?!"',
        "Fine...",
    ]


def test_newlines_end_chunks_and_blank_lines_vanish() -> None:
    assert by_char("First line\n\nSecond line\n") == ["First line", "Second line"]


def test_flush_returns_the_remainder_and_resets_for_the_next_reply() -> None:
    agg = SentenceAggregator(2)
    assert agg.feed("One two three, four") == ["One two three,"]
    assert agg.flush() == "four"
    assert agg.flush() is None
    assert agg.feed("Again one, two") == ["Again one,"]  # the next reply may cut a clause again


def test_multi_character_deltas() -> None:
    assert run(["Hel", "lo the", "re. I'm", " fine, thanks", ". Bye"]) == [
        "Hello there.",
        "I'm fine, thanks.",
        "Bye",
    ]


def test_a_long_first_sentence_is_cut_after_the_word_limit():
    from stages.llm.sentences import SentenceAggregator

    agg = SentenceAggregator(min_first_chunk_words=3, max_first_chunk_words=6)
    out = []
    for tok in ["Kittens", "settle", "in", "quickly", "when", "they", "feel", "safe", "and", "loved.", "Then", "they", "sleep", "a", "lot.", ""]:
        out += agg.feed(tok + " ")
    rest = agg.flush()
    # cut before "when" (a conjunction after three words), then sentences only
    assert out[0] == "Kittens settle in quickly"
    assert out[1] == "when they feel safe and loved."
    assert out[2] == "Then they sleep a lot." or rest == "Then they sleep a lot."


def test_word_limit_without_a_conjunction_and_only_for_the_first_chunk():
    from stages.llm.sentences import SentenceAggregator

    agg = SentenceAggregator(min_first_chunk_words=3, max_first_chunk_words=4)
    out = agg.feed("One two three four five six seven eight nine ten. ")
    out += agg.feed("Alpha beta gamma delta epsilon zeta eta theta. ")
    assert out[0] == "One two three four"
    assert out[1] == "five six seven eight nine ten."
    assert out[2].startswith("Alpha beta gamma delta epsilon")  # later chunks wait for sentences


def test_a_long_second_chunk_ends_at_a_clause_or_its_word_limit():
    from stages.llm.sentences import SentenceAggregator

    # The 2026-12-07 gap: "I'm sorry" then a 22-word sentence whose synthesis outlasted it.
    reply = ("I'm sorry for any misunderstanding, but as a voice assistant, I'm designed to "
             "provide assistance and support. Is there anything else?")
    agg = SentenceAggregator(min_first_chunk_words=1, max_first_chunk_words=2,
                             max_second_chunk_words=6)
    out = [c for tok in reply.split(" ") for c in agg.feed(" " + tok)]
    assert out == ["I'm sorry", "for any misunderstanding,",  # a clause after 3 words
                       "but as a voice assistant, I'm designed to provide assistance and support."]
    assert agg.flush() == "Is there anything else?"  # later chunks end at sentences

    # no clause mark: cut before a conjunction after the third word, else after the sixth
    agg = SentenceAggregator(1, 2, 6)
    assert agg.feed("Sure thing, ") == ["Sure thing,"]
    assert agg.feed("Let me look it up and book a table now. ") == [
        "Let me look it up", "and book a table now."]  # before "and", the fifth word
    agg.flush()
    assert agg.feed("Sure thing, ") == ["Sure thing,"]  # a new reply: its first chunk again
    assert agg.feed("one two three four five six seven eight. ") == [
        "one two three four five six", "seven eight."]
    agg.flush()
    # "but," alone is too short for a chunk of its own; a short sentence is not cut at all
    agg = SentenceAggregator(1, 2, 6)
    assert agg.feed("Well, but, yes I can. ") == ["Well,", "but, yes I can."]


def test_the_second_chunk_waits_for_a_sentence_when_its_limit_is_off():
    from stages.llm.sentences import SentenceAggregator

    agg = SentenceAggregator(1, 2)  # max_second_chunk_words 0
    out = agg.feed("I'm sorry for any misunderstanding, but as a voice assistant, I can help. ")
    assert out == ["I'm sorry", "for any misunderstanding, but as a voice assistant, I can help."]


def _until_repeat(chunks: list[str]) -> list[str]:
    watch, said = RepeatWatch(), []
    for chunk in chunks:
        if watch.again(chunk):
            break
        said.append(chunk)
    return said


@pytest.mark.parametrize(("chunks", "said"), [
    # loops SmolLM2 fell into in calls (voxline run on moonshine-voice's endgame recording)
    (["I'm sorry,", "I'm sorry.", "I'm sorry."], ["I'm sorry,"]),
    (["No,", "no, no, no.", "No, no, no.", "That's a good story."], ["No,", "no, no, no."]),
    # the same sentence cut into other chunks, and a quote's curly apostrophe
    (["That's a", "good story.", "That’s a good story!"], ["That's a", "good story."]),
    # two sentences in turn: stopped at the first said again
    (["Yes,", "it is open.", "We close at nine.", "It is open."], ["Yes,", "it is open.", "We close at nine."]),
    # the words just said, over a chunk's edge
    (["Thank you", "so much,", "thank you so much."], ["Thank you", "so much,"]),
    # a word twice is speech ("No, no."), three times a loop
    (["No,", "no.", "Okay."], ["No,", "no.", "Okay."]),
    (["No.", "No.", "No.", "No."], ["No.", "No."]),
    # nothing repeated, or nothing to repeat
    (["Sure,", "I can help with that.", "What time works for you?"],
     ["Sure,", "I can help with that.", "What time works for you?"]),
    (["…", "…", "Hello."], ["…", "…", "Hello."]),
])
def test_a_reply_stops_at_the_first_chunk_that_says_it_again(chunks: list[str], said: list[str]) -> None:
    assert _until_repeat(chunks) == said
