from stages.asr.wer import corpus_wer, normalize, wer


def test_normalisation():
    assert normalize("Mr. Smith's well-known 3 CATS!") == ["mister", "smith's", "well", "known", "three", "cats"]


def test_wer_counts_substitutions_insertions_deletions():
    assert wer("the cat sat", "the cat sat") == 0.0
    assert wer("the cat sat", "the bat sat") == 1 / 3
    assert wer("the cat sat", "the cat") == 1 / 3
    assert wer("the cat", "the cat sat down") == 1.0
    assert wer("", "") == 0.0
    assert corpus_wer([("a b c d", "a b c d"), ("a b", "x b")]) == 1 / 6
