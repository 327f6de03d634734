"""The sans-I/O Server-Sent Events parser."""

from __future__ import annotations

from stages.llm.sse import SSEEvent, SSEParser


def parse(*chunks: bytes, close: bool = True) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    for c in chunks:
        out.extend(p.feed(c))
    if close:
        out.extend(p.close())
    return out


def test_data_events_and_done() -> None:
    events = parse(b'data: {"a": 1}\n\ndata: [DONE]\n\n')
    assert [e.data for e in events] == ['{"a": 1}', "[DONE]"]
    assert events[0].event == "message"


def test_comments_and_keepalives_are_ignored() -> None:
    events = parse(b": ping\n\n:keep-alive\ndata: x\n\n: another\n\n")
    assert [e.data for e in events] == ["x"]


def test_multi_line_data_joins_with_newlines() -> None:
    assert parse(b"data: one\ndata:two\ndata\n\n")[0].data == "one\ntwo\n"


def test_only_one_leading_space_is_stripped() -> None:
    assert parse(b"data:  two spaces\n\n")[0].data == " two spaces"


def test_event_type_id_and_retry() -> None:
    p = SSEParser()
    events = p.feed(b"event: error\nid: 7\nretry: 1500\ndata: bad\n\ndata: next\n\n")
    assert events == [SSEEvent("bad", "error", "7"), SSEEvent("next", "message", "7")]
    assert p.retry_ms == 1500


def test_crlf_and_cr_line_endings() -> None:
    assert [e.data for e in parse(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n")] == ["a", "b", "c"]


def test_crlf_split_between_chunks_is_one_line_break() -> None:
    events = parse(b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n")
    assert [e.data for e in events] == ["a", "b"]


def test_byte_at_a_time_with_multibyte_utf8() -> None:
    raw = "data: héllo — 你好\n\n".encode()
    events = parse(*[raw[i : i + 1] for i in range(len(raw))])
    assert [e.data for e in events] == ["héllo — 你好"]


def test_events_come_out_only_when_complete() -> None:
    p = SSEParser()
    assert p.feed(b"data: par") == []
    assert p.feed(b"tial\n") == []
    assert p.feed(b"\n") == [SSEEvent("partial")]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    assert parse(b"\n\n\nevent: x\n\n") == []


def test_leading_bom_is_dropped() -> None:
    assert parse(b"\xef\xbb\xbfdata: x\n\n")[0].data == "x"


def test_unknown_fields_and_lines_without_colon_are_ignored() -> None:
    assert [e.data for e in parse(b"foo: bar\nnonsense\ndata: ok\n\n")] == ["ok"]


def test_close_delivers_a_last_event_without_its_blank_line() -> None:
    assert [e.data for e in parse(b"data: a\n\ndata: tail")] == ["a", "tail"]
    assert [e.data for e in parse(b"data: a\n\ndata: tail\n")] == ["a", "tail"]
    assert [e.data for e in parse(b"data: a\n\ndata: tail", close=False)] == ["a"]
