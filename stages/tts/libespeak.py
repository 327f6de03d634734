"""A ctypes binding to the eSpeak NG library bundled by ``espeakng-loader`` (no apt package).

The library is a process-wide singleton with one global synthesis callback, so this module
initializes it once and serializes every synthesis behind a lock.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import VoxlineError, require

_AUDIO_OUTPUT_SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT: synthesize inside espeak_Synth, no device
_INITIALIZE_DONT_EXIT = 0x8000  # never call exit() on a fatal error
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE = 1  # espeak_PARAMETER espeakRATE, words per minute
_DEFAULT_RATE_WPM = 175
_BUFFER_MS = 50  # audio per callback

_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class EspeakLibrary:
    """One loaded and initialized libespeak-ng. Use :func:`espeak_library` to get it."""

    def __init__(self) -> None:
        loader = require(
            "espeakng_loader", what="the eSpeak NG TTS", extra="embedded", package="espeakng-loader"
        )
        lib = ctypes.CDLL(loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        self._lib = lib
        # espeak_Initialize wants the folder that CONTAINS espeak-ng-data.
        home = str(Path(loader.get_data_path()).parent).encode()
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, home, _INITIALIZE_DONT_EXIT
        )
        if rate <= 0:
            raise VoxlineError(f"eSpeak NG failed to initialize with data in {home.decode()}")
        self.sample_rate = rate
        self.lock = threading.Lock()
        self._sink: Callable[[np.ndarray], bool] | None = None
        # Kept on self: ctypes does not keep the callback alive, and the library calls it later.
        self._callback = _SynthCallback(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)
        self._voice = ""

    def _on_audio(self, wav: Any, n: int, events: int | None) -> int:
        if n <= 0 or not wav or self._sink is None:
            return 0
        # a copy (the library reuses its buffer), read by address: np.ctypeslib.as_array would
        # make and cache a ctypes array type for every length n, for the process's lifetime
        pcm = np.frombuffer(ctypes.string_at(wav, 2 * n), dtype=np.int16).copy()
        return 0 if self._sink(pcm) else 1  # 1 aborts the synthesis

    def synthesize(
        self, text: str, voice: str, speed: float, sink: Callable[[np.ndarray], bool]
    ) -> None:
        """Speak ``text`` into ``sink`` (int16 chunks); ``sink`` returns False to abort."""
        data = text.encode("utf-8") + b"\0"
        with self.lock:
            if voice != self._voice:
                if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
                    raise VoxlineError(
                        f"eSpeak NG has no voice {voice!r} — pass --tts-voice with a voice name "
                        "such as en-us"
                    )
                self._voice = voice
            self._lib.espeak_SetParameter(_RATE, round(_DEFAULT_RATE_WPM * speed), 0)
            self._sink = sink
            try:
                err = self._lib.espeak_Synth(
                    data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
                )
            finally:
                self._sink = None
        if err != 0:
            raise VoxlineError(f"eSpeak NG failed to synthesize (error {err}): {text[:60]!r}")


_library: EspeakLibrary | None = None
_library_lock = threading.Lock()


def espeak_library() -> EspeakLibrary:
    global _library
    with _library_lock:
        if _library is None:
            _library = EspeakLibrary()
        return _library
