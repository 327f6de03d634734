"""The conversation history: system prompt, trimming old turns in blocks (a stable prefix),
truncated replies."""

from __future__ import annotations

from stages.llm.chat import ChatHistory


def test_messages_start_with_the_system_prompt() -> None:
    h = ChatHistory("Be brief.", 6)
    h.add_user("Hi")
    h.add_assistant("Hello!")
    assert h.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]


def test_keep_turns_equal_to_max_turns_is_the_old_one_turn_slide() -> None:
    h = ChatHistory("S", 2, keep_turns=2)
    h.add_assistant("Welcome!")  # the greeting is a turn of its own
    for i in range(4):
        h.add_user(f"q{i}")
        h.add_assistant(f"a{i}")
    h.add_user("now")
    assert [m["content"] for m in h.messages()] == ["S", "q2", "a2", "q3", "a3", "now"]


def test_old_turns_go_in_one_block_leaving_half() -> None:
    h = ChatHistory("S", 4)
    assert h.keep_turns == 2
    for i in range(5):
        h.add_user(f"q{i}")
        h.add_assistant(f"a{i}")
    # Five earlier turns would pass four: the oldest three go at once, as soon as the reply
    # is in (so a prefill for the next turn already sends the shorter history).
    assert [m["content"] for m in h.messages()] == ["S", "q3", "a3", "q4", "a4"]
    h.add_user("now")
    assert [m["content"] for m in h.messages()] == ["S", "q3", "a3", "q4", "a4", "now"]


def test_the_prompt_only_grows_between_block_drops() -> None:
    max_turns, keep = 6, 3
    h = ChatHistory("S", max_turns, keep)
    h.add_assistant("Welcome!")
    previous: list[dict[str, str]] = []
    changed = []
    for i in range(30):
        h.add_user(f"question {i}")
        request = h.messages()
        assert len(request) <= 1 + 2 * max_turns + 1  # system, earlier turns, this one
        if request[: len(previous)] != previous:
            changed.append(i)
        h.add_assistant(f"answer {i}")
        previous = request
    # The beginning changes once every max_turns - keep + 1 turns, not every turn.
    assert changed == list(range(6, 30, max_turns - keep + 1))


def test_a_user_message_without_a_reply_is_trimmed_when_the_next_turn_begins() -> None:
    h = ChatHistory("S", 2, keep_turns=1)
    for i in range(3):
        h.add_user(f"q{i}")  # turns whose replies are never added
    assert [m["content"] for m in h.messages()] == ["S", "q0", "q1", "q2"]
    h.add_user("q3")  # three earlier turns would pass two: one is kept
    assert [m["content"] for m in h.messages()] == ["S", "q2", "q3"]


def test_greeting_stays_while_it_is_recent() -> None:
    h = ChatHistory("", 2)
    h.add_assistant("Welcome!")
    h.add_user("q0")
    assert [m["content"] for m in h.messages()] == ["Welcome!", "q0"]


def test_zero_turns_keeps_only_the_current_question() -> None:
    h = ChatHistory("S", 0)
    h.add_user("old")
    h.add_assistant("reply")
    h.add_user("new")
    assert [m["content"] for m in h.messages()] == ["S", "new"]


def test_interrupted_replies_carry_the_mark_and_an_unheard_one_joins_the_callers_turns() -> None:
    h = ChatHistory("S", 6)
    h.add_user("Tell me a story")
    h.add_assistant("Once upon", truncated=True)
    h.add_user("Stop")
    h.add_assistant("", truncated=True)  # cut before its first word: the caller heard nothing
    assert h.messages_with("Hello?")[-2:] == [
        {"role": "assistant", "content": "Once upon…"}, {"role": "user", "content": "Stop Hello?"}]
    assert len(h.entries) == 4  # (messages_with left the history as it was)
    h.add_user("Hello?")
    h.add_assistant("")  # nothing said, nothing cut: left out
    h.add_user("Anyone?")
    assert [e.truncated for e in h.entries] == [False, True, False, False, False]
    assert [m["content"] for m in h.messages()] == [
        "S", "Tell me a story", "Once upon…", "Stop Hello?", "Anyone?",
    ]
    assert all(set(m) == {"role", "content"} for m in h.messages())
    plain = ChatHistory("S", 6, interrupted_mark="")
    plain.add_user("Tell me a story")
    plain.add_assistant("Once upon", truncated=True)
    assert plain.messages()[-1] == {"role": "assistant", "content": "Once upon"}


def test_an_unheard_greeting_or_tool_call_stays_as_the_mark() -> None:
    h = ChatHistory("S", 6)
    h.add_assistant("", truncated=True)  # the greeting, cut before its first word
    h.add_user("Hi")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    h.add_assistant("", truncated=True, tool_calls=(call,))  # its tools were called
    h.add_user("Hello?")
    assert [(m["role"], m["content"]) for m in h.messages()] == [
        ("system", "S"), ("assistant", "…"), ("user", "Hi"), ("assistant", "…"),
        ("user", "Hello?"),
    ]


def test_revise_replaces_a_message_where_it_stands() -> None:
    h = ChatHistory("S", 6)
    h.add_user("q0")
    a0 = h.add_assistant("the whole generated reply")
    h.add_user("q1")
    revised = h.revise(a0, "the whole")
    assert revised is not None and revised.truncated
    assert [m["content"] for m in h.messages()] == ["S", "q0", "the whole…", "q1"]
    assert h.revise(a0, "gone") is None  # (a0 itself is no longer in the history)


def test_tool_calls_and_results_render_as_the_openai_request_shape() -> None:
    h = ChatHistory("S", 6)
    h.add_user("book it")
    call = {"id": "c1", "type": "function", "function": {"name": "book", "arguments": "{}"}}
    h.add_assistant("", tool_calls=(call,))
    h.add_tool_result("c1", "book", "booked")
    assert h.messages()[2:] == [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "book", "content": "booked"},
    ]


def test_discard_turn_forgets_the_last_question_and_its_reply() -> None:
    h = ChatHistory("S", 6)
    h.add_user("q0")
    h.add_assistant("a0")
    h.add_user("q1")
    h.discard_turn()
    assert [m["content"] for m in h.messages()] == ["S", "q0", "a0"]
