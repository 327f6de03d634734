"""Batched label-looping TDT decoding against a plain per-utterance reference with the same
semantics, on random and adversarial models; the reference itself against transformers'
``generate`` where the two semantics coincide."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stages.asr.parakeet.cuda_graphs import GraphTDTDecoder  # noqa: E402
from stages.asr.parakeet.model import ParakeetTDT  # noqa: E402
from stages.asr.parakeet.tdt import LabelLoopingTDT  # noqa: E402

from .tiny_models import hf_reference, random_model  # noqa: E402


def reference_decode(model: ParakeetTDT, enc_proj: torch.Tensor, length: int, max_symbols: int):
    """One utterance, one frame at a time, Python integers throughout."""
    d = model.dims.decoder
    blank, durations = d.blank_id, list(d.durations)
    state = model.decoder.initial_state(1, enc_proj.device, enc_proj.dtype)
    g, state = model.decoder.step(torch.tensor([blank], device=enc_proj.device), state)
    pred = model.joint.project_prediction(g)[0]
    tokens, frames, durs = [], [], []
    t, last_frame, run = 0, -1, 0
    while t < length:
        logits = model.joint.logits(enc_proj[t], pred)
        k = int(logits[: blank + 1].argmax())
        dur = durations[int(logits[blank + 1 :].argmax())]
        if k == blank:
            t += max(dur, 1)
            continue
        tokens.append(k)
        frames.append(t)
        durs.append(dur)
        run = run + 1 if last_frame == t else 1
        last_frame = t
        g, state = model.decoder.step(torch.tensor([k], device=enc_proj.device), state)
        pred = model.joint.project_prediction(g)[0]
        t += dur
        if dur == 0 and run >= max_symbols:
            t += 1
    return tuple(tokens), tuple(frames), tuple(durs)


def _enc_proj(model: ParakeetTDT, lengths: list[int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(
        len(lengths), max(max(lengths), 1), model.dims.decoder.joint_hidden, generator=gen
    )


def _bias(
    model: ParakeetTDT, blank: float = 0.0, duration: dict[int, float] | None = None
) -> ParakeetTDT:
    d = model.dims.decoder
    with torch.no_grad():
        model.joint.out.bias[d.blank_id] += blank
        for index, value in (duration or {}).items():
            model.joint.out.bias[d.blank_id + 1 + index] += value
    return model


def _check_against_reference(
    model: ParakeetTDT, lengths: list[int], max_symbols: int, seed: int = 0
):
    enc = _enc_proj(model, lengths, seed)
    tdt = LabelLoopingTDT(model.decoder, model.joint, model.dims.decoder.durations, max_symbols)
    with torch.no_grad():
        batched = tdt.decode(enc, torch.tensor(lengths))
        for i, n in enumerate(lengths):
            ref = reference_decode(model, enc[i], n, max_symbols)
            got = batched[i]
            assert (got.tokens, got.frames, got.durations) == ref, f"row {i} (length {n})"
    return batched


LENGTHS = [37, 1, 0, 12, 25, 2]


@pytest.mark.parametrize("kind", ["v3", "v2", "110m"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_models_match_the_reference(kind: str, seed: int) -> None:
    _, model = random_model(kind, seed=seed)
    out = _check_against_reference(model, LENGTHS, max_symbols=10, seed=seed)
    assert sum(len(o.tokens) for o in out) > 0


def test_blank_heavy_model() -> None:
    _, model = _bias_pair(blank=2.0)
    out = _check_against_reference(model, LENGTHS, max_symbols=10, seed=3)
    emitted = sum(len(o.tokens) for o in out)
    assert 0 < emitted < sum(LENGTHS)  # mostly blanks, but not only


def _bias_pair(**kwargs):
    cfg, model = random_model("v3", seed=7)
    return cfg, _bias(model, **kwargs)


def test_forced_duration_zero_hits_max_symbols_on_every_frame() -> None:
    _, model = _bias_pair(blank=-100.0, duration={0: 100.0})
    for max_symbols in (1, 3, 10):
        out = _check_against_reference(model, LENGTHS, max_symbols=max_symbols, seed=4)
        for o, n in zip(out, LENGTHS, strict=True):
            assert len(o.tokens) == n * max_symbols
            assert o.frames == tuple(t for t in range(n) for _ in range(max_symbols))


def test_blank_with_duration_zero_advances_one_frame() -> None:
    _, model = _bias_pair(blank=100.0, duration={0: 100.0})
    out = _check_against_reference(model, LENGTHS, max_symbols=10, seed=5)
    assert all(o.tokens == () for o in out)


def test_long_durations_can_end_past_the_last_frame() -> None:
    _, model = _bias_pair(blank=-100.0, duration={4: 100.0})
    out = _check_against_reference(model, [10, 3, 1], max_symbols=10, seed=6)
    assert [o.frames for o in out] == [(0, 4, 8), (0,), (0,)]
    assert all(set(o.durations) == {4} for o in out)


def test_durations_that_are_not_their_index() -> None:
    _, model = random_model("v3", seed=8, durations=[0, 2, 3])
    _bias(model, duration={1: 1.0})
    out = _check_against_reference(model, LENGTHS, max_symbols=4, seed=8)
    assert set(d for o in out for d in o.durations) <= {0, 2, 3}


def test_outputs_are_well_formed() -> None:
    _, model = random_model("v2", seed=9)
    out = _check_against_reference(model, LENGTHS, max_symbols=2, seed=9)
    for o, n in zip(out, LENGTHS, strict=True):
        assert list(o.frames) == sorted(o.frames)
        assert all(0 <= f < n for f in o.frames)
        assert all(o.frames.count(f) <= 2 for f in set(o.frames))
        assert all(0 <= tok < model.dims.decoder.blank_id for tok in o.tokens)


def test_cpu_decoder_ignores_graph_modes_and_splits_big_batches() -> None:
    _, model = random_model("v3", seed=2)
    tdt = LabelLoopingTDT(model.decoder, model.joint, model.dims.decoder.durations, 10)
    lengths = [9, 4, 0, 7, 3]
    enc = _enc_proj(model, lengths, 2)
    direct = tdt.decode(enc, torch.tensor(lengths))
    via_graph_decoder = GraphTDTDecoder(tdt, mode="auto", max_bucket=2).decode(
        enc, torch.tensor(lengths)
    )
    assert via_graph_decoder == direct


def test_reference_agrees_with_transformers_generate() -> None:
    """transformers' TDT generate has no max-symbols rule and reads the duration index as the
    duration, so compare where neither matters: durations 0..4 and duration 0 never predicted."""
    _, model = random_model("v3", seed=12)
    _bias(model, blank=-0.5, duration={0: -100.0})
    hf = hf_reference(model)
    feats = torch.randn(
        1, model.dims.encoder.n_mels, 400, generator=torch.Generator().manual_seed(12)
    )
    with torch.no_grad():
        enc, lengths = model.encoder(feats, torch.tensor([400]))
        ref = reference_decode(model, model.joint.project_encoder(enc)[0], int(lengths[0]), 10)
        out = hf.generate(input_features=feats.transpose(1, 2), max_new_tokens=400)
    blank = model.dims.decoder.blank_id
    hf_tokens = tuple(int(s) for s in out.sequences[0].tolist()[1:] if s != blank)
    assert len(ref[0]) > 5
    assert hf_tokens == ref[0]
