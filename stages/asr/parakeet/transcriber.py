"""Audio buffers in, decoded token sequences out: batching, padding, encoder, TDT decoder.

Buffers are sorted by length and cut into batches of at most ``max_batch`` so that little of each
batch is padding; results come back in the caller's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from stages.asr.parakeet.cuda_graphs import GraphTDTDecoder
from stages.asr.parakeet.model import ParakeetTDT
from stages.asr.parakeet.tdt import DecodedUtterance, LabelLoopingTDT

# (features (B, M, T), lengths) -> (encoder frames (B, T', d), lengths); e.g. a TensorRT engine
EncoderFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class ParakeetTranscriber:
    def __init__(
        self,
        model: ParakeetTDT,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        *,
        decoder_mode: str = "auto",
        max_batch: int = 64,
        max_symbols: int | None = None,
        encoder: EncoderFn | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).to_dtype(dtype).eval()
        self.dtype = dtype
        self.max_batch = max_batch
        dd = model.dims.decoder
        self.tdt = LabelLoopingTDT(
            model.decoder, model.joint, dd.durations, max_symbols or dd.max_symbols
        )
        self.decoder = (
            GraphTDTDecoder(self.tdt, mode=decoder_mode) if self.device.type == "cuda" else None
        )
        self.encoder = encoder
        fe = model.dims.front_end
        self.frame_seconds = fe.hop_length * model.dims.encoder.subsampling_factor / fe.sample_rate

    @property
    def decoder_mode(self) -> str:
        return self.decoder.mode if self.decoder is not None else "no_graphs"

    def transcribe(self, audio: Sequence[np.ndarray]) -> list[DecodedUtterance]:
        order = sorted(range(len(audio)), key=lambda i: -len(audio[i]))
        results: list[DecodedUtterance | None] = [None] * len(audio)
        for start in range(0, len(order), self.max_batch):
            chunk = order[start : start + self.max_batch]
            for i, decoded in zip(
                chunk, self._transcribe_batch([audio[i] for i in chunk]), strict=True
            ):
                results[i] = decoded
        return [r for r in results if r is not None]

    @torch.inference_mode()
    def _transcribe_batch(self, audio: Sequence[np.ndarray]) -> list[DecodedUtterance]:
        enc_proj, lens = self.encode(audio)
        if self.decoder is not None:
            return self.decoder.decode(enc_proj, lens)
        return self.tdt.decode(enc_proj, lens)

    @torch.inference_mode()
    def encode(self, audio: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """One padded batch → projected encoder frames (B, T', J) and their lengths."""
        n_fft = self.model.dims.front_end.n_fft
        longest = max([len(a) for a in audio] + [n_fft])  # the STFT needs at least one window
        # Page-locked on CUDA (the caching host allocator reuses it), so the copy is async.
        host = torch.empty(
            len(audio), longest, dtype=torch.float32, pin_memory=self.device.type == "cuda"
        )
        for row, a in enumerate(audio):
            host[row, : len(a)] = torch.from_numpy(np.asarray(a, dtype=np.float32))
            host[row, len(a) :] = 0.0
        samples = torch.tensor([len(a) for a in audio], dtype=torch.long)
        wave = host.to(self.device, non_blocking=True)
        samples = samples.to(self.device, non_blocking=True)
        if self.encoder is None:
            return self.model.encode(wave, samples)
        feats, lengths = self.model.features(wave, samples)
        enc, enc_lengths = self.encoder(feats.to(self.dtype), lengths)
        return self.model.joint.project_encoder(enc.to(self.dtype)), enc_lengths
