"""Parakeet-TDT speech recognition in PyTorch: .nemo loading, FastConformer, batched TDT decoding.

Import ``stages.asr.parakeet.backend.ParakeetBackend`` for the engine; this package imports no
torch until a backend is built.
"""
