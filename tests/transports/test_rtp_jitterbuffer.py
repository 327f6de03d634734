"""The reordering jitter buffer: order restored, loss declared once the buffer is deep enough,
late and duplicate packets dropped, sequence wrap-around handled."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from transports.rtp.jitterbuffer import JitterBuffer


def feed(jb: JitterBuffer, seqs: list[int]) -> list[bytes | None]:
    out: list[bytes | None] = []
    for s in seqs:
        out += jb.push(s & 0xFFFF, str(s).encode())
    return out


def test_in_order_packets_leave_immediately() -> None:
    jb = JitterBuffer(depth=4)
    assert jb.push(10, b"a") == [b"a"]
    assert jb.push(11, b"b") == [b"b"]


def test_reordered_packets_come_out_in_order() -> None:
    jb = JitterBuffer(depth=4)
    assert feed(jb, [1, 3, 2, 4]) == [b"1", b"2", b"3", b"4"]
    assert jb.stats.reordered == 1 and jb.stats.lost == 0


def test_a_gap_becomes_loss_once_depth_packets_wait() -> None:
    jb = JitterBuffer(depth=3)
    out = feed(jb, [1, 3, 4, 5])
    assert out == [b"1", None, b"3", b"4", b"5"]
    assert jb.stats.lost == 1
    assert feed(jb, [2]) == [] and jb.stats.late == 1


def test_duplicates_dropped_and_wrap_around() -> None:
    jb = JitterBuffer(depth=4)
    out = feed(jb, [0xFFFE, 0xFFFF, 0xFFFF, 0x10000, 0x10001])
    assert out == [b"65534", b"65535", b"65536", b"65537"]
    assert jb.stats.duplicate == 1


def test_a_big_jump_restarts_the_stream() -> None:
    jb = JitterBuffer(depth=4, max_gap=50)
    assert feed(jb, [1, 2, 1000, 1001]) == [b"1", b"2", b"1000", b"1001"]
    assert jb.stats.lost == 0


@given(st.lists(st.permutations([0, 1, 2, 3]), min_size=1, max_size=8), st.integers(0, 0xFFFF))
def test_any_local_reordering_yields_every_packet_once_in_order(windows, base: int) -> None:
    # the first packet opens the stream; later ones are shuffled only within windows of 4, so
    # reordering never outruns the buffer depth
    seqs = [base] + [base + 1 + 4 * w + k for w, perm in enumerate(windows) for k in perm]
    jb = JitterBuffer(depth=8)
    out = feed(jb, seqs) + jb.flush()
    assert out == [str(base + k).encode() for k in range(1 + 4 * len(windows))]
    assert jb.stats.lost == 0


@given(st.lists(st.integers(0, 0xFFFF), max_size=200), st.integers(1, 8))
def test_arbitrary_sequences_never_break_accounting(seqs: list[int], depth: int) -> None:
    jb = JitterBuffer(depth=depth)
    out = feed(jb, seqs) + jb.flush()
    st_ = jb.stats
    assert st_.received == len(seqs)
    assert len([x for x in out if x is not None]) == st_.released
    assert st_.released + st_.late + st_.duplicate == st_.received
