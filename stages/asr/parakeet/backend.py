"""``ParakeetBackend``: the Parakeet-TDT model behind voxline's batched ASR backend interface.

``cfg.model`` is a ``.nemo`` path (or the name of one in ``$VOXLINE_MODELS`` /
``~/.cache/voxline/models``). It runs on CUDA when torch sees a GPU, else on the CPU with
``cfg.threads`` threads. ``cfg.compute_type``: float32, float16 or bfloat16; anything else
(``int8``, the Whisper default, or ``auto``) means bfloat16 on a GPU and float32 on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agent.config import ASRConfig
from agent.errors import require
from stages.asr.backend import ASRCapabilities, BatchCost, Hypothesis

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}  # fmt: skip


class ParakeetBackend:
    """Loads a .nemo checkpoint once; ``transcribe_batch`` decodes many buffers per call."""

    name = "parakeet"
    sample_rate = 16000

    def __init__(
        self,
        cfg: ASRConfig,
        *,
        device: str | None = None,
        decoder_mode: str = "auto",
        max_batch: int = 64,
    ) -> None:
        from stages.asr.parakeet.nemo import read_nemo, resolve_model

        path = resolve_model(cfg.model)  # raises ModelNotFoundError before any heavy import
        torch = require("torch", what="the Parakeet ASR backend", extra="parakeet")
        require("yaml", what="the Parakeet .nemo loader", extra="parakeet", package="pyyaml")
        from stages.asr.parakeet.dims import dims_from_config
        from stages.asr.parakeet.tokenizer import PieceTokenizer
        from stages.asr.parakeet.transcriber import ParakeetTranscriber
        from stages.asr.parakeet.weights import build_model

        archive = read_nemo(path)
        dims = dims_from_config(archive.config)
        model = build_model(dims, archive.state_dict)
        labels = (
            archive.config.get("labels")
            or (archive.config.get("joint") or {}).get("vocabulary")
            or []
        )
        self.tokenizer = PieceTokenizer(labels, archive.tokenizer_model())
        if self.tokenizer.vocab_size != dims.decoder.vocab_size:
            from stages.asr.parakeet.dims import CheckpointError

            raise CheckpointError(
                f"{path}: tokenizer has {self.tokenizer.vocab_size} pieces, the model {dims.decoder.vocab_size}"
            )

        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        kind = _DTYPES.get(
            cfg.compute_type.lower(), "bfloat16" if dev.type == "cuda" else "float32"
        )
        if dev.type == "cpu":
            torch.set_num_threads(max(1, cfg.threads))
            kind = "float32" if kind == "float16" else kind  # CPU fp16 matmuls are slow and lossy
        self.path: Path = path
        self.dims = dims
        self.capabilities = ASRCapabilities(
            sample_rate=self.sample_rate,
            max_batch=max_batch,
            lanes=1,  # one model, one CUDA stream and its captured graphs: one call at a time
            # A batch costs far less than its parts, on a GPU and even on the CPU (a 110m model
            # on 2 threads: RTFx 7.8 at batch 1, 13.9 at batch 8).
            batch_cost=BatchCost.SUBLINEAR,
            prompts=False,  # a TDT model takes no text prompt
            word_times=True,  # from the token frames and durations
        )
        self.transcriber = ParakeetTranscriber(
            model, dev, getattr(torch, kind), decoder_mode=decoder_mode, max_batch=max_batch
        )

    @property
    def max_batch(self) -> int:
        return self.capabilities.max_batch

    @property
    def device(self) -> str:
        return str(self.transcriber.device)

    def transcribe_batch(
        self, audio: Sequence[np.ndarray], prompts: Sequence[str] | None = None
    ) -> list[Hypothesis]:
        """Float32 mono 16 kHz buffers → one hypothesis each; ``prompts`` are ignored (a TDT
        model takes no text prompt)."""
        if not audio:
            return []
        decoded = self.transcriber.transcribe(audio)
        frame = self.transcriber.frame_seconds
        out = []
        for d in decoded:
            starts = [f * frame for f in d.frames]
            ends = [(f + max(n, 1)) * frame for f, n in zip(d.frames, d.durations, strict=True)]
            out.append(
                Hypothesis(
                    text=self.tokenizer.text(d.tokens),
                    words=self.tokenizer.words(d.tokens, starts, ends),
                    tokens=d.tokens,
                    token_times=tuple(starts),
                )
            )
        return out

    def warmup(self) -> None:
        """Decode one second of silence: loads kernels and, on a GPU, captures the graphs."""
        self.transcribe_batch([np.zeros(self.sample_rate, dtype=np.float32)])
