"""The conversation history: system prompt, trimming to the last turns, truncated replies."""

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


def test_only_the_last_turns_are_kept_besides_the_current_one() -> None:
    h = ChatHistory("S", 2)
    h.add_assistant("Welcome!")  # the greeting is a turn of its own
    for i in range(4):
        h.add_user(f"q{i}")
        h.add_assistant(f"a{i}")
    h.add_user("now")
    assert [m["content"] for m in h.messages()] == ["S", "q2", "a2", "q3", "a3", "now"]


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


def test_truncated_replies_are_flagged_and_empty_ones_left_out_of_requests() -> None:
    h = ChatHistory("S", 6)
    h.add_user("Tell me a story")
    h.add_assistant("Once upon", truncated=True)
    h.add_user("Stop")
    h.add_assistant("", truncated=True)
    h.add_user("Hello?")
    assert [e.truncated for e in h.entries] == [False, True, False, True, False]
    assert [m["content"] for m in h.messages()] == [
        "S",
        "Tell me a story",
        "Once upon",
        "Stop",
        "Hello?",
    ]
    assert all(set(m) == {"role", "content"} for m in h.messages())


def test_discard_turn_forgets_the_last_question_and_its_reply() -> None:
    h = ChatHistory("S", 6)
    h.add_user("q0")
    h.add_assistant("a0")
    h.add_user("q1")
    h.discard_turn()
    assert [m["content"] for m in h.messages()] == ["S", "q0", "a0"]
