"""The TDT label-looping decoder on CUDA, replayed as CUDA graphs.

Modes, tried in this order when ``mode="auto"``:

- ``full_graph``: the whole loop — setup, WHILE(active){ find label; WHILE(blank){ skip };
  record + predict } — is one graph with two conditional WHILE nodes: one launch per batch and no
  host synchronisation until the results are read.
- ``no_while_loops``: the four loop stages as four graphs, driven by a host loop that reads the
  two loop flags (one sync per iteration).
- ``no_graphs``: the same stages run eagerly (also what the CPU uses).

Buffers are preallocated per batch-size bucket (powers of two) and grown when a longer input
arrives; padding rows get length 0 and never activate. Every mode runs the same kernels on the
same buffers, so the tokens are identical; the GPU benchmark checks that.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from stages.asr.parakeet.conditional_nodes import WhileNode, while_node_openers
from stages.asr.parakeet.tdt import DecodedUtterance, LabelLoopingTDT, LoopState

log = logging.getLogger(__name__)

MODES = ("full_graph", "no_while_loops", "no_graphs")
_MIN_FRAMES = 375  # 30 s of encoder frames: most inputs never trigger a re-capture
_WARMUP_PASSES = 3


@contextlib.contextmanager
def _stream_restored(device: torch.device) -> Iterator[None]:
    """The current stream afterwards is the one before, even when a capture fails half-way
    (torch's graph context leaves its capture stream current when ending the capture raises)."""
    previous = torch.cuda.current_stream(device)
    try:
        yield
    finally:
        torch.cuda.set_stream(previous)


@dataclass(slots=True)
class _Bucket:
    state: LoopState
    mode: str
    graphs: list[torch.cuda.CUDAGraph] = field(default_factory=list)


class GraphTDTDecoder:
    """Decodes projected encoder frames on a CUDA device with the best graph mode available."""

    def __init__(self, tdt: LabelLoopingTDT, mode: str = "auto", max_bucket: int = 256) -> None:
        if mode not in ("auto", *MODES):
            raise ValueError(
                f"unknown decoder mode {mode!r}; choose auto or one of {', '.join(MODES)}"
            )
        self.tdt = tdt
        self.requested = mode
        self.max_bucket = max_bucket
        self._buckets: dict[int, _Bucket] = {}
        self._pool: tuple[int, int] | None = None
        self.while_impl = ""  # which conditional-node implementation full_graph uses

    @property
    def mode(self) -> str:
        """The mode of the most recently built bucket (what ``auto`` settled on)."""
        if not self._buckets:
            return self.requested
        return list(self._buckets.values())[-1].mode

    @staticmethod
    def bucket_size(batch: int) -> int:
        size = 1
        while size < batch:
            size *= 2
        return size

    @torch.inference_mode()
    def decode(self, enc_proj: torch.Tensor, lens: torch.Tensor) -> list[DecodedUtterance]:
        b, t, _ = enc_proj.shape
        if b == 0:
            return []
        if b > self.max_bucket:  # split rather than capture ever larger graphs
            out: list[DecodedUtterance] = []
            for i in range(0, b, self.max_bucket):
                out += self.decode(enc_proj[i : i + self.max_bucket], lens[i : i + self.max_bucket])
            return out
        if enc_proj.device.type != "cuda":
            return self.tdt.decode(enc_proj, lens)
        dtype = self.tdt.joint.out.weight.dtype  # graphs run without autocast, in the joint's dtype
        enc_proj = enc_proj.to(dtype)
        size = self.bucket_size(b)
        bucket = self._buckets.get(size)
        if bucket is None or bucket.state.max_time < t or bucket.state.enc_proj.dtype != dtype:
            frames = max(t, _MIN_FRAMES, bucket.state.max_time if bucket else 0)
            bucket = self._build(size, frames, enc_proj.device, dtype)
            self._buckets[size] = bucket
        bucket.state.load(enc_proj, lens)
        self._replay(bucket)
        return bucket.state.results(b)

    def _replay(self, bucket: _Bucket) -> None:
        s = bucket.state
        if bucket.mode == "full_graph":
            bucket.graphs[0].replay()
        elif bucket.mode == "no_while_loops":
            before_outer, before_inner, inner, after_inner = bucket.graphs
            before_outer.replay()
            while bool(s.active_any):
                before_inner.replay()
                while bool(s.advance_any):
                    inner.replay()
                after_inner.replay()
        else:
            self.tdt.run(s)

    def _build(
        self, batch: int, max_time: int, device: torch.device, dtype: torch.dtype
    ) -> _Bucket:
        state = self.tdt.new_state(batch, max_time, device, dtype)
        self._warm_up(state)
        wanted = MODES if self.requested == "auto" else (self.requested,)
        for mode in wanted:
            try:
                if mode == "full_graph":
                    return _Bucket(state, mode, [self._capture_full(state)])
                if mode == "no_while_loops":
                    return _Bucket(state, mode, self._capture_stages(state))
                return _Bucket(state, mode)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: use the next mode
                if self.requested != "auto":
                    raise
                log.info("TDT decoder: %s unavailable (%s); falling back", mode, exc)
                torch.cuda.synchronize(device)
        raise AssertionError("no_graphs never fails to build")

    def _warm_up(self, state: LoopState) -> None:
        """Run every stage a few times off the capture stream: kernels load, cuDNN picks its
        LSTM algorithm and the allocator fills its cache before anything is captured."""
        state.lens.fill_(1)
        side = torch.cuda.Stream(state.lens.device)
        side.wait_stream(torch.cuda.current_stream(state.lens.device))
        with torch.cuda.stream(side):
            for _ in range(_WARMUP_PASSES):
                self.tdt.before_outer(state)
                self.tdt.before_inner(state)
                self.tdt.inner_step(state)
                self.tdt.after_inner(state)
        torch.cuda.current_stream(state.lens.device).wait_stream(side)
        state.lens.zero_()

    def _graph_pool(self) -> tuple[int, int]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def _capture_full(self, state: LoopState) -> torch.cuda.CUDAGraph:
        errors = []
        for name, while_node in while_node_openers():
            try:
                graph = self._capture_with(state, while_node)
                self.while_impl = name
                return graph
            except Exception as exc:  # noqa: BLE001 - try the next implementation
                errors.append(f"{name}: {exc}")
                torch.cuda.synchronize(state.lens.device)
        raise RuntimeError(
            "no conditional-node implementation worked: " + ("; ".join(errors) or "none installed")
        )

    def _capture_with(self, state: LoopState, while_node: WhileNode) -> torch.cuda.CUDAGraph:
        tdt = self.tdt
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(state.lens.device)
        with (
            _stream_restored(state.lens.device),
            torch.cuda.graph(
                graph, pool=self._graph_pool(), stream=stream, capture_error_mode="thread_local"
            ),
        ):
            tdt.before_outer(state)
            with while_node(state.active_any):
                tdt.before_inner(state)
                with while_node(state.advance_any):
                    tdt.inner_step(state)
                tdt.after_inner(state)
        return graph

    def _capture_stages(self, state: LoopState) -> list[torch.cuda.CUDAGraph]:
        graphs = []
        stream = torch.cuda.Stream(state.lens.device)
        for stage in (
            self.tdt.before_outer,
            self.tdt.before_inner,
            self.tdt.inner_step,
            self.tdt.after_inner,
        ):
            graph = torch.cuda.CUDAGraph()
            with (
                _stream_restored(state.lens.device),
                torch.cuda.graph(
                    graph, pool=self._graph_pool(), stream=stream, capture_error_mode="thread_local"
                ),
            ):
                stage(state)
            graphs.append(graph)
        return graphs
