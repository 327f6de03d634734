"""The CUDA-graph decoder modes give exactly the eager loop's tokens (GPU only; skipped without
CUDA — the GPU benchmark runs these checks too)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stages.asr.parakeet.conditional_nodes import while_node_openers  # noqa: E402
from stages.asr.parakeet.cuda_graphs import GraphTDTDecoder  # noqa: E402
from stages.asr.parakeet.tdt import LabelLoopingTDT  # noqa: E402

from .test_tdt import _bias, reference_decode  # noqa: E402
from .tiny_models import random_model  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LENGTHS = [37, 1, 0, 12, 25, 2, 60]


def _setup(kind: str, seed: int, **bias):
    _, model = random_model(kind, seed=seed)
    _bias(model, **bias)
    model = model.cuda()
    tdt = LabelLoopingTDT(model.decoder, model.joint, model.dims.decoder.durations, 4)
    gen = torch.Generator().manual_seed(seed)
    enc = torch.randn(
        len(LENGTHS), max(LENGTHS), model.dims.decoder.joint_hidden, generator=gen
    ).cuda()
    return model, tdt, enc, torch.tensor(LENGTHS).cuda()


@pytest.mark.parametrize("mode", ["no_graphs", "no_while_loops", "full_graph"])
@pytest.mark.parametrize("bias", [{}, {"blank": -100.0, "duration": {0: 100.0}}, {"blank": 1.0}])
def test_every_mode_matches_the_eager_loop_and_the_reference(mode: str, bias: dict) -> None:
    if mode == "full_graph" and not while_node_openers():
        pytest.skip("no conditional-node implementation (torch native or cuda-python) here")
    model, tdt, enc, lens = _setup("v3", 3, **bias)
    eager = tdt.decode(enc, lens)
    decoder = GraphTDTDecoder(tdt, mode=mode)
    with torch.inference_mode():
        for _ in range(2):  # a replay must not depend on the previous one
            assert decoder.decode(enc, lens) == eager
        for i, n in enumerate(LENGTHS):
            ref = reference_decode(model, enc[i], n, 4)
            assert (eager[i].tokens, eager[i].frames, eager[i].durations) == ref
    assert decoder.mode == mode


def test_auto_mode_rebuilds_for_a_longer_input_and_a_bigger_batch() -> None:
    model, tdt, enc, lens = _setup("110m", 4)
    decoder = GraphTDTDecoder(tdt)
    assert decoder.decode(enc[:3], lens[:3]) == tdt.decode(enc[:3], lens[:3])
    long_enc = torch.randn(5, 500, enc.shape[-1], device="cuda")
    long_lens = torch.tensor([500, 420, 1, 0, 77], device="cuda")
    assert decoder.decode(long_enc, long_lens) == tdt.decode(long_enc, long_lens)
    assert decoder.mode in ("full_graph", "no_while_loops")
