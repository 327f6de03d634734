"""The token bucket that holds caller audio to real time, and the JSON loader every socket
shell uses: what each accepts and refuses."""

import pytest

from transports import jsonwire
from transports.ratelimit import TokenBucket, audio_bucket


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=10, burst=5)
    assert [bucket.take(0.0) for _ in range(6)] == [True] * 5 + [False]
    assert bucket.take(0.05) is False  # half a token back
    assert bucket.take(0.1) is True  # one
    assert sum(bucket.take(100.0) for _ in range(50)) == 5  # saved up to the burst, no more
    with pytest.raises(ValueError):
        TokenBucket(0, 1)


def test_audio_is_held_to_real_time_with_slack() -> None:
    bucket = audio_bucket(0.02)
    taken = sum(bucket.take(0.0) for _ in range(1000))
    assert taken == 100  # 2 s of burst
    taken = sum(bucket.take(t / 1000) for t in range(1, 10_001) for _ in range(2))
    assert 620 <= taken <= 630  # 10 s at 50 frames/s plus 25%, sent at twice real time


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000, "nested too deeply"),
    ('{"a": Infinity}', "Infinity"),
    ('{"a": -Infinity}', "Infinity"),
    ('{"a": NaN}', "NaN"),
    ('{"a": 1e400}', "out of range"),
    (b"{\"a\": \"\xff\"}", "decode"),
    ("{", "Expecting"),
])
def test_hostile_json_raises_value_error(text, words) -> None:
    with pytest.raises(ValueError, match=words):
        jsonwire.loads(text)


def test_ordinary_json_is_unchanged() -> None:
    assert jsonwire.loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
