"""Where does a CUDA-graph WHILE node break? Each probe runs in its own process (a segfault ends
only that probe) and prints a marker after each step: capture, capture end, instantiate, replay,
result. For the lent GPU machine, run by ``scripts/device_check.sh`` before the benchmark.

    python scripts/gpu_probe.py                  # every probe, one child process each
    python scripts/gpu_probe.py counter nested   # these probes, one child process each
    python scripts/gpu_probe.py --one counter    # one probe, in this process

Probes, simplest first: a counter loop with in-place ops only; the same with a temporary
allocated in the body; two nested loops; a two-layer LSTM step in the body (cuDNN with flat
weights, cuDNN with weights in separate chunks, torch's own kernels); the tiny Parakeet TDT
decoder's full graph against its eager loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "stages" / "parakeet"))  # tiny_models


def mark(step: str) -> None:
    print(f"    {step}", flush=True)


def _capture(body: Callable[[], None], keep: bool = True):
    import torch

    graph = torch.cuda.CUDAGraph(keep_graph=keep)
    stream = torch.cuda.Stream()
    previous = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            body()
    finally:
        torch.cuda.set_stream(previous)
    mark("capture ended")
    if keep:
        graph.instantiate()
        mark("instantiated")
    return graph


def _opener():
    from stages.asr.parakeet.conditional_nodes import while_node_openers

    openers = dict(while_node_openers())
    mark(f"openers: {sorted(openers)}")
    return openers.get("cuda-python") or next(iter(openers.values()))


def _replay_and_count(body: Callable[[], None], counter, want: int) -> None:
    import torch

    _capture(body).replay()
    torch.cuda.synchronize()
    mark("replayed")
    assert int(counter) == want, int(counter)
    mark(f"result ok: {int(counter)}")


def _scalars(dtype_names: str):
    """Zero-dim CUDA tensors: 'l' a long, 'b' a bool, in order."""
    import torch

    kinds = {"l": torch.long, "b": torch.bool}
    return [torch.zeros((), dtype=kinds[k], device="cuda") for k in dtype_names]


def probe_counter(alloc: bool = False) -> None:
    import torch

    while_node = _opener()
    x, go = _scalars("lb")

    def body() -> None:
        x.zero_()
        torch.lt(x, 10, out=go)
        with while_node(go):
            if alloc:
                y = x + 1  # a temporary: allocated inside the body
                x.copy_(y)
            else:
                x.add_(1)
            torch.lt(x, 10, out=go)

    _replay_and_count(body, x, 10)


def probe_nested() -> None:
    import torch

    while_node = _opener()
    i, j, n, go_i, go_j = _scalars("lllbb")

    def body() -> None:
        i.zero_()
        n.zero_()
        torch.lt(i, 5, out=go_i)
        with while_node(go_i):
            j.zero_()
            torch.lt(j, 3, out=go_j)
            with while_node(go_j):
                j.add_(1)
                n.add_(1)
                torch.lt(j, 3, out=go_j)
            i.add_(1)
            torch.lt(i, 5, out=go_i)

    _replay_and_count(body, n, 15)


def probe_lstm(cudnn: bool = True, flat: bool = True) -> None:
    import torch

    torch.backends.cudnn.enabled = cudnn
    while_node = _opener()
    lstm = torch.nn.LSTM(16, 16, num_layers=2, batch_first=True).cuda()
    if flat:
        lstm.flatten_parameters()
    else:  # weights in separate chunks, as after a .to(): cuDNN copies them on every call
        for name, p in list(lstm.named_parameters()):
            setattr(lstm, name, torch.nn.Parameter(p.detach().clone()))
    inp = torch.randn(4, 1, 16, device="cuda")
    h = torch.zeros(2, 4, 16, device="cuda")
    c = torch.zeros(2, 4, 16, device="cuda")
    k = torch.zeros((), dtype=torch.long, device="cuda")
    go = torch.zeros((), dtype=torch.bool, device="cuda")
    with torch.inference_mode():
        hh, cc = h.clone(), c.clone()
        for _ in range(3):
            _, (hh, cc) = lstm(inp, (hh, cc))
        want = hh.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream
            lstm(inp, (h, c))
        torch.cuda.current_stream().wait_stream(side)

        def body() -> None:
            h.zero_()
            c.zero_()
            k.zero_()
            torch.lt(k, 3, out=go)
            with while_node(go):
                _, (h2, c2) = lstm(inp, (h, c))
                h.copy_(h2)
                c.copy_(c2)
                k.add_(1)
                torch.lt(k, 3, out=go)

        graph = _capture(body)
        graph.replay()
        torch.cuda.synchronize()
        mark("replayed")
        err = float((h - want).abs().max())
        assert err < 1e-4, err
        mark(f"result ok: max error {err:.2e}")


def probe_tdt() -> None:
    import torch
    from tiny_models import random_model

    from stages.asr.parakeet.cuda_graphs import GraphTDTDecoder
    from stages.asr.parakeet.tdt import LabelLoopingTDT

    _, model = random_model("v3", seed=3)
    model = model.cuda().eval()
    tdt = LabelLoopingTDT(model.decoder, model.joint, model.dims.decoder.durations, 4)
    lengths = [37, 1, 0, 12, 25, 2, 60]
    gen = torch.Generator().manual_seed(3)
    enc = torch.randn(len(lengths), 60, model.dims.decoder.joint_hidden, generator=gen).cuda()
    lens = torch.tensor(lengths).cuda()
    with torch.inference_mode():
        eager = tdt.decode(enc, lens)
        mark(f"eager: {sum(len(u.tokens) for u in eager)} tokens")
        decoder = GraphTDTDecoder(tdt, mode="full_graph")
        got = decoder.decode(enc, lens)
        mark(f"full graph built ({decoder.while_impl}) and replayed")
        assert got == eager, "tokens differ from the eager loop"
        assert decoder.decode(enc, lens) == eager, "second replay differs"
        mark("result ok: identical tokens, twice")


PROBES: dict[str, Callable[[], None]] = {
    "counter": probe_counter,
    "counter_alloc": lambda: probe_counter(alloc=True),
    "nested": probe_nested,
    "lstm_cudnn": probe_lstm,
    "lstm_cudnn_unflattened": lambda: probe_lstm(flat=False),
    "lstm_native": lambda: probe_lstm(cudnn=False),
    "tdt": probe_tdt,
}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        import faulthandler

        faulthandler.enable()
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device")
            return 0
        PROBES[sys.argv[2]]()
        return 0
    unknown = [n for n in sys.argv[1:] if n not in PROBES]
    if unknown:
        print(f"unknown probe(s) {unknown}; choose from {', '.join(PROBES)}")
        return 2
    import torch

    if not torch.cuda.is_available():
        print("probes: not run (no CUDA device)")
        return 0
    results = {}
    for name in sys.argv[1:] or PROBES:
        start = time.perf_counter()
        print(f"== probe {name}", flush=True)
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--one", name],
                capture_output=True, text=True, timeout=90, env={**os.environ},
            )  # fmt: skip
            rc = proc.returncode
            out = (proc.stdout + proc.stderr).strip().splitlines()
        except subprocess.TimeoutExpired as exc:
            rc, out = "timeout", str(exc.stdout or "").splitlines()
        for line in out[-25:]:
            print(f"  | {line}")
        results[name] = rc
        print(f"== probe {name}: exit {rc} in {time.perf_counter() - start:.1f} s", flush=True)
    print("probes:", " ".join(f"{k}={v}" for k, v in results.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
