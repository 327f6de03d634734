"""Batched greedy TDT decoding with label-looping semantics, in plain torch.

Each outer iteration finds the next non-blank label of every utterance (the inner loop skips
blanks, jumping by the predicted duration), then runs the prediction network once for the whole
batch. All state lives in preallocated tensors that the four stages update in place, with no
host synchronisation inside a stage, so ``cuda_graphs`` can capture the same stages as CUDA
graphs. Semantics follow NeMo's ``greedy_batch`` label-looping decoder:

- a blank predicted with duration 0 advances one frame;
- a label whose frame already holds ``max_symbols`` labels, predicted with duration 0, forces one
  frame of progress;
- a label found at the last frame may carry the utterance past its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from stages.asr.parakeet.decoder import Joint, PredictionNetwork


@dataclass(slots=True, frozen=True)
class DecodedUtterance:
    tokens: tuple[int, ...]
    frames: tuple[int, ...]  # encoder frame (80 ms) of each token
    durations: tuple[int, ...]  # predicted duration of each token, in encoder frames


class LoopState:
    """Every tensor the decoding loop touches, allocated once for (batch, max_time)."""

    def __init__(
        self,
        batch: int,
        max_time: int,
        max_symbols: int,
        joint_hidden: int,
        pred: PredictionNetwork,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.batch, self.max_time = batch, max_time
        long = dict(device=device, dtype=torch.long)
        flag = dict(device=device, dtype=torch.bool)
        self.enc_proj = torch.zeros(batch, max_time, joint_hidden, device=device, dtype=dtype)
        self.lens = torch.zeros(batch, **long)
        self.rows = torch.arange(batch, device=device)

        self.labels = torch.zeros(batch, **long)
        self.durations = torch.zeros(batch, **long)
        self.time = torch.zeros(batch, **long)
        self.safe_time = torch.zeros(batch, **long)
        self.time_of_label = torch.zeros(batch, **long)
        self.last_frame = torch.zeros(batch, **long)

        self.active = torch.zeros(batch, **flag)
        self.active_prev = torch.zeros(batch, **flag)
        self.advance = torch.zeros(batch, **flag)
        self.found = torch.zeros(batch, **flag)
        self.active_any = torch.zeros((), **flag)
        self.advance_any = torch.zeros((), **flag)

        self.zero_state = pred.initial_state(batch, device, dtype)
        self.h, self.c = pred.initial_state(batch, device, dtype)
        self.dec_out = torch.zeros(batch, joint_hidden, device=device, dtype=dtype)

        # A frame holds at most max_symbols labels; one spare slot takes the unconditional write.
        capacity = max_time * max_symbols + 1
        self.out_tokens = torch.zeros(batch, capacity, **long)
        self.out_frames = torch.zeros(batch, capacity, **long)
        self.out_durations = torch.zeros(batch, capacity, **long)
        self.out_len = torch.zeros(batch, **long)
        self.last_stamp = torch.zeros(batch, **long)
        self.last_stamp_count = torch.zeros(batch, **long)

    def load(self, enc_proj: torch.Tensor, lens: torch.Tensor) -> None:
        """Copy a (b ≤ batch, t ≤ max_time) input in; rows past b get length 0 (inactive)."""
        b, t, _ = enc_proj.shape
        self.enc_proj[:b, :t].copy_(enc_proj)
        if t < self.max_time:
            self.enc_proj[:b, t:].zero_()
        self.lens[:b].copy_(lens)
        self.lens[b:].zero_()

    def results(self, count: int) -> list[DecodedUtterance]:
        lengths = self.out_len[:count].tolist()
        longest = max(lengths, default=0)
        tokens = self.out_tokens[:count, :longest].tolist()
        frames = self.out_frames[:count, :longest].tolist()
        durations = self.out_durations[:count, :longest].tolist()
        return [
            DecodedUtterance(tuple(tokens[i][:n]), tuple(frames[i][:n]), tuple(durations[i][:n]))
            for i, n in enumerate(lengths)
        ]


class LabelLoopingTDT:
    """The four loop stages over a :class:`LoopState`, and an eager driver for them."""

    def __init__(
        self, pred: PredictionNetwork, joint: Joint, durations: Sequence[int], max_symbols: int
    ) -> None:
        if max_symbols < 1:
            raise ValueError("max_symbols must be at least 1")
        self.pred = pred
        self.joint = joint
        self.blank = pred.dims.blank_id
        self.max_symbols = max_symbols
        self.duration_values = list(durations)
        self._durations: dict[torch.device, torch.Tensor] = {}

    def new_state(
        self, batch: int, max_time: int, device: torch.device, dtype: torch.dtype
    ) -> LoopState:
        return LoopState(
            batch, max_time, self.max_symbols, self.joint.out.in_features, self.pred, device, dtype
        )

    def _duration_table(self, device: torch.device) -> torch.Tensor:
        table = self._durations.get(device)
        if table is None:
            table = torch.tensor(self.duration_values, dtype=torch.long, device=device)
            self._durations[device] = table
        return table

    def _predict(self, s: LoopState) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy label and duration for every row at its current (clamped) frame."""
        frame = s.enc_proj[s.rows, s.safe_time]
        logits = self.joint.logits(frame, s.dec_out)
        labels = logits[:, : self.blank + 1].argmax(-1)
        durations = self._duration_table(logits.device)[logits[:, self.blank + 1 :].argmax(-1)]
        # A blank must move forward, whatever duration it predicts.
        durations = durations.masked_fill((labels == self.blank) & (durations == 0), 1)
        return labels, durations

    def _refresh_activity(self, s: LoopState) -> None:
        torch.minimum(s.time, s.last_frame, out=s.safe_time)
        s.safe_time.clamp_(min=0)
        torch.lt(s.time, s.lens, out=s.active)

    def before_outer(self, s: LoopState) -> None:
        s.labels.fill_(self.blank)
        g, (h, c) = self.pred.step(s.labels, s.zero_state)
        s.h.copy_(h)
        s.c.copy_(c)
        s.dec_out.copy_(self.joint.project_prediction(g))
        s.out_len.zero_()
        s.last_stamp.fill_(-1)
        s.last_stamp_count.zero_()
        s.time.zero_()
        s.time_of_label.zero_()
        s.durations.zero_()
        torch.sub(s.lens, 1, out=s.last_frame)
        self._refresh_activity(s)
        torch.any(s.active, out=s.active_any)

    def before_inner(self, s: LoopState) -> None:
        s.active_prev.copy_(s.active)
        labels, durations = self._predict(s)
        s.labels.copy_(labels)
        s.durations.copy_(durations)
        s.time_of_label.copy_(s.time)
        s.time.add_(s.durations * s.active)
        self._refresh_activity(s)
        torch.logical_and(s.active, s.labels == self.blank, out=s.advance)
        torch.any(s.advance, out=s.advance_any)

    def inner_step(self, s: LoopState) -> None:
        """Rows still on a blank move to their next frame and predict again."""
        s.time_of_label.copy_(torch.where(s.advance, s.time, s.time_of_label))
        labels, durations = self._predict(s)
        s.labels.copy_(torch.where(s.advance, labels, s.labels))
        s.time.copy_(torch.where(s.advance, s.time + durations, s.time))
        s.durations.copy_(torch.where(s.advance, durations, s.durations))
        self._refresh_activity(s)
        torch.logical_and(s.active, s.labels == self.blank, out=s.advance)
        torch.any(s.advance, out=s.advance_any)

    def after_inner(self, s: LoopState) -> None:
        """Record the labels found, advance the prediction network for those rows only."""
        torch.logical_and(s.active_prev, s.labels != self.blank, out=s.found)
        slot = s.out_len[:, None]
        s.out_tokens.scatter_(1, slot, s.labels[:, None])
        s.out_frames.scatter_(1, slot, s.time_of_label[:, None])
        s.out_durations.scatter_(1, slot, s.durations[:, None])
        s.out_len.add_(s.found)
        same_frame = s.last_stamp == s.time_of_label
        count = torch.where(same_frame, s.last_stamp_count + 1, torch.ones_like(s.last_stamp_count))
        s.last_stamp_count.copy_(torch.where(s.found, count, s.last_stamp_count))
        s.last_stamp.copy_(torch.where(s.found, s.time_of_label, s.last_stamp))

        g, (h, c) = self.pred.step(s.labels, (s.h, s.c))
        keep = s.found[None, :, None]
        s.h.copy_(torch.where(keep, h, s.h))
        s.c.copy_(torch.where(keep, c, s.c))
        s.dec_out.copy_(torch.where(s.found[:, None], self.joint.project_prediction(g), s.dec_out))

        # Too many labels on one frame with duration 0: force one frame of progress.
        force = (
            s.active & s.found & (s.last_stamp_count >= self.max_symbols) & (s.last_stamp == s.time)
        )
        s.time.add_(force)
        self._refresh_activity(s)
        torch.any(s.active, out=s.active_any)

    def run(self, s: LoopState) -> None:
        """The loop, eagerly: reads two flags per iteration on the host (free on CPU)."""
        self.before_outer(s)
        while bool(s.active_any):
            self.before_inner(s)
            while bool(s.advance_any):
                self.inner_step(s)
            self.after_inner(s)

    @torch.inference_mode()
    def decode(self, enc_proj: torch.Tensor, lens: torch.Tensor) -> list[DecodedUtterance]:
        """Projected encoder frames (B, T, J) + lengths (B,) → one decoded utterance per row."""
        b, t, _ = enc_proj.shape
        if b == 0:
            return []
        state = self.new_state(b, max(t, 1), enc_proj.device, enc_proj.dtype)
        state.load(enc_proj, lens)
        self.run(state)
        return state.results(b)
