"""Tests of the Parakeet-TDT backend (stages/asr/parakeet)."""
