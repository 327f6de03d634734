"""Voice activity detection: the Silero VAD ONNX model run on onnxruntime + numpy (no torch), and
the stage that turns its per-window probabilities into SpeechStarted/Paused/Stopped frames."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from agent.audio import FROM_INT16
from agent.config import VADConfig
from agent.errors import MissingExtraError, ModelNotFoundError, require
from agent.frames import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    AudioIn,
    Direction,
    EndOfCall,
    Frame,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
)
from agent.stage import DOWN, Stage

WINDOW = 512  # samples per model call at 16 kHz (32 ms): the only size Silero v5+ accepts
CONTEXT = 64  # trailing samples of the previous window the model sees before each window
# Where the caller's voice stopped, for the voice-to-voice clock: the last frame of the utterance
# whose RMS is within 35 dB of its loudest frame (and above -60 dBFS). Silero's probability
# decays over a window or three after the voice stops, so its own end is late by up to ~100 ms.
LOUD_DB = 35.0
LOUD_FLOOR = 1e-3
_LOUD_RATIO_SQ = 10 ** (-LOUD_DB / 10)
STOP_LEAD_WINDOWS = 3  # the stop silence may start at most this much before Silero's pause


def silero_model_path() -> Path:
    """The ``silero_vad.onnx`` shipped by the ``silero-vad`` pip package.

    Located with ``find_spec`` so the package's ``__init__`` (which imports torch) never runs.
    """
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError("Silero VAD", "embedded", "silero-vad")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "data" / "silero_vad.onnx"
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"silero_vad.onnx not found in the silero-vad package at "
        f"{', '.join(spec.submodule_search_locations)} — reinstall it with "
        f"`pip install --force-reinstall silero-vad` or `pip install 'voxline[embedded]'`"
    )


class SileroModel:
    """One stream's Silero VAD: 512-sample float32 windows in, speech probabilities out.

    The recurrent state (2, 1, 128) and the 64-sample context belong to one audio stream; call
    :meth:`reset` between streams. Not thread-safe; one instance per stream.
    """

    def __init__(self, cfg: VADConfig, path: str | Path | None = None) -> None:
        ort = require("onnxruntime", what="Silero VAD", extra="embedded")
        model_path = Path(path) if path else silero_model_path()
        if not model_path.is_file():
            raise ModelNotFoundError(f"Silero VAD model file not found: {model_path}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, cfg.threads)
        opts.inter_op_num_threads = 1
        # Many small calls: spinning worker threads would burn a core between windows.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.path = model_path
        self._session: Any = ort.InferenceSession(
            str(model_path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._ort = ort
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        self._bind_buffers()

    def _bind_buffers(self) -> None:
        """This stream's buffers, bound to the session's inputs and outputs once: a window is
        one model call that reads and writes them in place, with no array made per call."""
        self._input = np.zeros((1, CONTEXT + WINDOW), dtype=np.float32)  # [context | window]
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._state_out = np.zeros_like(self._state)
        self._out = np.zeros((1, 1), dtype=np.float32)
        # Views made once: slicing per call would make (and free) an array object each time.
        self._window_in = self._input[0, CONTEXT:]
        self._context_in = self._input[0, :CONTEXT]
        self._context_next = self._input[0, -CONTEXT:]
        ortvalue = self._ort.OrtValue.ortvalue_from_numpy  # shares the numpy buffer on CPU
        inputs = {"input": ortvalue(self._input), "state": ortvalue(self._state),
                  "sr": ortvalue(self._sr)}
        outputs = {"output": ortvalue(self._out), "stateN": ortvalue(self._state_out)}
        binding = self._session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in outputs.items():
            binding.bind_ortvalue_output(name, value)
        self._binding = binding
        self._bound = (inputs, outputs)  # the binding points into them: keep them alive

    def fork(self) -> SileroModel:
        """A model for another stream that shares this one's loaded session (onnxruntime runs
        one session from many threads), so a call costs 3 kB of state, not a model load."""
        twin = object.__new__(SileroModel)
        twin.path = self.path
        twin._session = self._session
        twin._ort = self._ort
        twin._sr = self._sr
        twin._bind_buffers()
        return twin

    def reset(self) -> None:
        """Forget the stream: zero the recurrent state and the context."""
        self._input.fill(0.0)
        self._state.fill(0.0)

    def prob(self, window: np.ndarray) -> float:
        """Speech probability of one 512-sample float32 window (values in [-1, 1])."""
        if window.shape != (WINDOW,):
            raise ValueError(f"Silero VAD takes {WINDOW}-sample windows, got shape {window.shape}")
        np.copyto(self._window_in, window)
        self._session.run_with_iobinding(self._binding)
        np.copyto(self._state, self._state_out)
        np.copyto(self._context_in, self._context_next)
        return float(self._out[0, 0])

    def probs_batch(self, streams: list[np.ndarray]) -> list[np.ndarray]:
        """Speech probability of every 512-sample window of each stream (the last window
        zero-padded), all streams advanced together: one model call per window position for the
        whole batch instead of one per stream. Each stream starts from a fresh state, exactly
        as :meth:`prob` after :meth:`reset`; this model's own stream is left untouched.

        Streams run longest first; a stream drops out of the batch when it ends, so the batch
        shrinks instead of computing padding."""
        counts = [-(-len(s) // WINDOW) for s in streams]
        order = sorted(range(len(streams)), key=lambda i: counts[i], reverse=True)
        out = [np.empty(c, np.float32) for c in counts]
        if not order or counts[order[0]] == 0:
            return out
        b = len(order)
        x = np.zeros((b, CONTEXT + WINDOW), np.float32)
        state = np.zeros((2, b, 128), np.float32)
        active = b
        for w in range(counts[order[0]]):
            while counts[order[active - 1]] <= w:
                active -= 1
            a, z = w * WINDOW, (w + 1) * WINDOW
            for row in range(active):
                s = streams[order[row]]
                piece = s[a:z]
                x[row, CONTEXT : CONTEXT + len(piece)] = piece
                if len(piece) < WINDOW:
                    x[row, CONTEXT + len(piece) :] = 0.0
            feeds = {"input": x[:active], "state": np.ascontiguousarray(state[:, :active]),
                     "sr": self._sr}
            p, new_state = self._session.run(None, feeds)
            state[:, :active] = new_state
            x[:active, :CONTEXT] = x[:active, -CONTEXT:]
            for row in range(active):
                out[order[row]][w] = p[row, 0]
        return out


class VADStage(Stage):
    """Silero VAD with start/stop hysteresis over the caller's audio.

    Every ``AudioIn`` is forwarded at once and unchanged; the events it triggers follow it.
    Speech starts after ``start_ms`` of windows at or above ``threshold`` (``SpeechStarted.at`` is
    the first of them). In speech, the first window below ``neg_threshold`` sends
    ``SpeechPaused``; if no window reaches ``threshold`` again within ``stop_ms`` of where the
    voice stopped (the last frame within 35 dB of the utterance's loudest, at most 3 windows
    before the pause), ``SpeechStopped`` follows with ``at`` where the speech ended. A window
    costs about 0.2 ms, so the model runs inline. ``model``, if given, is this stream's model
    (e.g. ``shared.fork()``); it is reset. ``SpeechStarted.at`` is where the VAD heard speech
    begin; keeping ``pad_ms`` of audio before it is the consumer's business (the ASR).
    """

    name = "vad"
    consumes = frozenset({AudioIn})  # and EndOfCall, a control frame every stage sees

    def __init__(self, cfg: VADConfig, model: SileroModel | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = model if model is not None else SileroModel(cfg)
        self.model.reset()
        self._start_windows = max(1, -(-cfg.start_ms * SAMPLE_RATE // (1000 * WINDOW)))
        self._stop_samples = cfg.stop_ms * SAMPLE_RATE // 1000
        self._window = np.zeros(WINDOW, dtype=np.float32)
        # A frame's samples as float, for its loudness; grown (rarely) for a longer frame.
        self._scratch = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._fill = 0
        self._next = 0  # media sample expected next; the window buffer ends there
        self.windows = 0
        self.speech_windows = 0  # windows at or above ``threshold``
        self.rejected = 0  # AudioIn frames not analysed (bad rate, dtype or shape)
        self.last_prob = 0.0
        self._reported: set[str] = set()
        self._reset_speech()

    @property
    def in_speech(self) -> bool:
        return self._in_speech

    def _reset_speech(self) -> None:
        self._in_speech = False
        self._run = 0  # consecutive windows >= threshold while not in speech
        self._run_start = 0
        self._started_at = 0
        self._paused_at: int | None = None
        self._speech_end = 0  # end of the last window counted as speech
        self._speech_end_ns = 0
        self._peak_sq = 0.0  # loudest frame's mean square since the last utterance ended
        self._loud_end = -1  # end sample and arrival of the last frame near that peak
        self._loud_ns = 0

    # --- frames ----------------------------------------------------------------------------
    def process(self, frame: Frame, direction: Direction) -> None:
        if direction is DOWN:
            if isinstance(frame, AudioIn):
                self.push(frame, DOWN)
                pcm = self._as_int16_or_float(frame)
                if pcm is not None:
                    self._consume(pcm, frame.offset, frame.t_ns)
                return
            if isinstance(frame, EndOfCall):
                if self._in_speech:
                    self._stop(self._paused_at if self._paused_at is not None else self._speech_end)
                self._reset_speech()
                self.model.reset()
                self._fill = 0
        self.push(frame, direction)

    def _as_int16_or_float(self, frame: AudioIn) -> np.ndarray | None:
        """The frame's samples as int16 or float32 mono, or None (after an ErrorFrame)."""
        pcm = frame.pcm
        if frame.sample_rate != SAMPLE_RATE:
            self._reject(
                f"rate:{frame.sample_rate}",
                f"VAD got {frame.sample_rate} Hz audio; the pipeline carries {SAMPLE_RATE} Hz — "
                f"resample in the transport",
            )
            return None
        if not isinstance(pcm, np.ndarray):
            self._reject(
                "type",
                f"VAD got AudioIn.pcm of type {type(pcm).__name__}; expected an int16 numpy array",
            )
            return None
        if pcm.ndim != 1:
            if pcm.ndim != 2 or 1 not in pcm.shape:
                self._reject("shape", f"VAD got audio of shape {pcm.shape}; expected mono")
                return None
            pcm = pcm.reshape(-1)
        if pcm.dtype == np.int16 or pcm.dtype == np.float32:
            return pcm
        if pcm.dtype.kind == "f":
            return pcm.astype(np.float32)
        self._reject(
            f"dtype:{pcm.dtype}",
            f"VAD got {pcm.dtype} audio; expected int16 PCM (or float in [-1, 1])",
        )
        return None

    def _reject(self, kind: str, message: str) -> None:
        self.rejected += 1
        # One error per kind of problem: a bad stream would otherwise send 50 errors a second.
        if kind not in self._reported:
            self._reported.add(kind)
            self.push_error(message)

    def _consume(self, pcm: np.ndarray, offset: int, t_ns: int) -> None:
        is_int = pcm.dtype == np.int16
        n = len(pcm)
        x = pcm
        if is_int and n:
            # int16 to float in place: a ufunc that casts on the way (np.multiply(pcm, scale,
            # out=...)) makes a temporary copy of its input for every call.
            if n > len(self._scratch):
                self._scratch = np.zeros(n, dtype=np.float32)
            x = self._scratch if n == len(self._scratch) else self._scratch[:n]
            np.copyto(x, pcm)
            np.multiply(x, FROM_INT16, out=x)
        if n:
            ms = float(np.dot(x, x)) / n
            if ms == ms:  # not NaN
                self._peak_sq = max(self._peak_sq, ms)
                if ms >= max(LOUD_FLOOR * LOUD_FLOOR, self._peak_sq * _LOUD_RATIO_SQ):
                    self._loud_end, self._loud_ns = offset + n, t_ns
        if offset != self._next:
            # A gap or overlap in the media timeline: a window must not straddle it.
            self._fill = 0
            self._next = offset
        i = 0
        while i < n:
            take = min(WINDOW - self._fill, n - i)
            dst = self._window[self._fill : self._fill + take]
            if is_int:
                np.copyto(dst, x[i : i + take])
            else:
                np.clip(pcm[i : i + take], -1.0, 1.0, out=dst)
                np.nan_to_num(dst, copy=False, nan=0.0)
            self._fill += take
            i += take
            if self._fill == WINDOW:
                self._fill = 0
                end = offset + i
                self._on_window(self.model.prob(self._window), end - WINDOW, end, t_ns)
        self._next = offset + n

    def _on_window(self, p: float, start: int, end: int, t_ns: int) -> None:
        cfg = self.cfg
        self.windows += 1
        self.last_prob = p
        speech = p >= cfg.threshold
        if speech:
            self.speech_windows += 1
        if not self._in_speech:
            if not speech:
                self._run = 0
                return
            if self._run == 0:
                self._run_start = start
            self._run += 1
            if self._run >= self._start_windows:
                self._in_speech = True
                self._run = 0
                self._started_at = self._run_start
                self._speech_end, self._speech_end_ns = end, t_ns
                self.push(SpeechStarted(self._started_at), DOWN)
            return
        if self._paused_at is None:
            if p < cfg.neg_threshold:
                self._paused_at = start
                self.push(SpeechPaused(start), DOWN)
                self._maybe_stop(end)
            else:
                self._speech_end, self._speech_end_ns = end, t_ns
        elif speech:
            self._paused_at = None
            self._speech_end, self._speech_end_ns = end, t_ns
        else:
            self._maybe_stop(end)

    def _voice_ended(self) -> bool:
        """Whether the last loud frame belongs to this utterance and ends by its last speech window."""
        return self._started_at <= self._loud_end <= self._speech_end + WINDOW and self._loud_ns > 0

    def _maybe_stop(self, end: int) -> None:
        assert self._paused_at is not None
        # ``stop_ms`` of silence counts from where the voice stopped: Silero's pause comes a
        # window or three later. Never more than STOP_LEAD_WINDOWS earlier than that pause, so a
        # soft-spoken tail (speech to Silero, quiet to the 35-dB rule) is not cut short.
        quiet_from = self._paused_at
        if self._voice_ended():
            quiet_from = max(min(quiet_from, self._loud_end), quiet_from - STOP_LEAD_WINDOWS * WINDOW)
        if end - quiet_from >= self._stop_samples:
            self._stop(self._paused_at)
            self._reset_speech()

    def _stop(self, at: int) -> None:
        end_ns = self._speech_end_ns
        if self._voice_ended():
            end_ns = min(end_ns, self._loud_ns)  # the voice itself stopped before the VAD said so
        self.push(SpeechStopped(at, started_at=self._started_at, speech_end_ns=end_ns), DOWN)
