"""Voice activity detection: the Silero VAD ONNX model run on onnxruntime + numpy (no torch), and
the stage that turns its per-window probabilities into SpeechStarted/Paused/Stopped frames."""

from __future__ import annotations

import importlib.util
import math
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
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
)
from agent.stage import DOWN, Stage
from stages.onnx_session import cpu_session

WINDOW = 512  # samples per model call at 16 kHz (32 ms): the only size Silero v5+ accepts
CONTEXT = 64  # trailing samples of the previous window the model sees before each window
# Where the caller's voice stopped, for the voice-to-voice clock: the last frame of the utterance
# whose RMS is within 35 dB of its loudest frame (and above -60 dBFS). Silero's probability
# decays over a window or three after the voice stops, so its own end is late by up to ~100 ms.
LOUD_DB = 35.0
LOUD_FLOOR = 1e-3
_LOUD_RATIO_SQ = 10 ** (-LOUD_DB / 10)
STOP_LEAD_WINDOWS = 3  # the stop silence may start at most this much before Silero's pause
# With the noise rule on, a loud frame must also rise noise_margin_db + LOUD_NOISE_DB above the
# line's noise floor: the line is not the voice. The extra 3 dB because a 20-ms frame of a
# fluctuating noise (babble) passes the margin that its 32-ms windows keep to; without it the
# voice's end ran on into the noise and the stop silence was counted from Silero's late pause.
LOUD_NOISE_DB = 3.0
_LOUD_NOISE_RATIO = 10 ** (LOUD_NOISE_DB / 10)
# The noise floor (VADConfig.noise_*): the minimum of the windows' smoothed energy over the last
# noise_window_ms, kept as FLOOR_BLOCKS block minima so a window costs a few float operations.
# Smoothing keeps the minimum near the noise's typical level rather than its deepest dip.
FLOOR_BLOCKS = 8
FLOOR_SMOOTH = 0.5  # weight of a new window in the smoothed energy
FLOOR_MIN = 1e-9  # -90 dBFS: digital silence has a floor, so "near the floor" stays meaningful
# NOISE_QUIET of the last NOISE_WINDOWS windows near the floor pause speech as one window below
# neg_threshold does (one burst of a fluctuating noise, babble, does not undo that), and the stop
# silence counts from the voice's end, at most STOP_LEAD_WINDOWS before that pause: a stop on the
# noise rule comes about 160 ms later than one on a quiet line. Measured on the speech set
# (benchmarks/noise.py): a pause after 4 or 6 such windows stopped recordings with a noisy floor
# mid-sentence, where Silero hears the speaker go on (its 71 stops became 80 and 78); after 8,
# 76, and the end of speech in noise came no later at p95. (The 5 more are all in two recordings
# with a -38 and a -45 dBFS floor, where the loud rule now finds the voice's end.)
NOISE_WINDOWS = 9
NOISE_QUIET = 8
_NOISE_MASK = (1 << NOISE_WINDOWS) - 1


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
        self.path = model_path
        # Many small calls: spinning worker threads would burn a core between windows.
        self._session: Any = cpu_session(ort, model_path, max(1, cfg.threads))
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
        """Speech probability of every 512-sample window of each stream (float32 in [-1, 1], or
        int16; the last window zero-padded), all streams advanced together: one model call per window position for the
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
                if piece.dtype == np.int16:  # scaled here: no float copy of a long file
                    np.multiply(piece, FROM_INT16, out=x[row, CONTEXT : CONTEXT + len(piece)])
                else:
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
    before the pause), ``SpeechStopped`` follows with ``at`` where the speech ended; if one
    does, ``SpeechResumed`` says the pause was mid-utterance. A window
    costs about 0.2 ms, so the model runs inline. ``model``, if given, is this stream's model
    (e.g. ``shared.fork()``); it is reset. ``SpeechStarted.at`` is where the VAD heard speech
    begin; keeping ``pad_ms`` of audio before it is the consumer's business (the ASR).

    The noise rule (``noise_margin_db`` > 0): Silero may go on hearing speech in a line's noise
    long after the voice stopped (babble, mostly). So the stage tracks the stream's noise floor,
    and once a voice has risen ``noise_voice_db`` above it (in this utterance or within the
    floor's history), windows within ``noise_margin_db`` of the floor count as silence, whatever
    Silero says: 8 of the last 9 pause speech, and they neither resume it nor start it. A loud
    frame must also clear the floor, so the voice's end does not run on into the noise. Where
    speech starts stays Silero's decision; in noise with no voice above it, so does its end.
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
        self._noise_rule = cfg.noise_margin_db > 0
        self._near_ratio = 10 ** (cfg.noise_margin_db / 10)
        self._voice_ratio = 10 ** (cfg.noise_voice_db / 10)
        history = cfg.noise_window_ms * SAMPLE_RATE // (1000 * WINDOW)
        self._block_windows = max(1, -(-history // FLOOR_BLOCKS))
        self._history = self._block_windows * FLOOR_BLOCKS * WINDOW  # samples
        self._block_mins = [math.inf] * FLOOR_BLOCKS
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
        self._reset_floor()
        self._reset_speech()

    @property
    def in_speech(self) -> bool:
        return self._in_speech

    @property
    def noise_floor_dbfs(self) -> float:
        """The stream's noise floor as tracked so far (-inf before the first window)."""
        floor = min(self._floor, self._block_min)
        return 10 * math.log10(floor) if floor < math.inf else -math.inf

    def _reset_floor(self) -> None:
        self._smooth = -1.0  # smoothed window energy (mean square); negative: none yet
        self._block_mins[:] = [math.inf] * FLOOR_BLOCKS
        self._block = 0
        self._block_fill = 0
        self._block_min = math.inf  # the current block's minimum, not yet in _block_mins
        self._floor = math.inf  # minimum of the finished blocks
        self._voice_end = -self._history  # end of the last window noise_voice_db above the floor
        self._loud_noise = 0.0  # a frame at or below this mean square is the line, not a voice
        self._faint = False  # the last window was below that, with a voice heard on the line

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
        self._near_bits = 0  # the last NOISE_WINDOWS windows, newest lowest: 1 where near the floor
        self._floor_cap = math.inf  # the floor when this utterance started

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
                self._reset_floor()
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
                if ms >= max(LOUD_FLOOR * LOUD_FLOOR, self._peak_sq * _LOUD_RATIO_SQ,
                             self._loud_noise):
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
                p = self.model.prob(self._window)
                # The noise pauses speech only after the voice: never in a window that holds
                # the end of a loud frame, so the stop silence still counts from the voice's end.
                near = self._noise_rule and self._near_floor(self._window, end)
                near = near and self._loud_end <= end - WINDOW
                self._on_window(p, near, end - WINDOW, end, t_ns)
        self._next = offset + n

    def _near_floor(self, window: np.ndarray, end: int) -> bool:
        """Track the noise floor with this window (ending at sample ``end``); whether it is
        within ``noise_margin_db`` of the floor, with a voice heard well above the floor in this
        utterance or within the floor's history (a soft restart right after a stop has no voice
        of its own, yet it is the same line's noise)."""
        energy = float(np.dot(window, window)) / WINDOW
        s = energy if self._smooth < 0 else self._smooth + FLOOR_SMOOTH * (energy - self._smooth)
        self._smooth = s
        if s < self._block_min:
            self._block_min = s
        self._block_fill += 1
        if self._block_fill == self._block_windows:
            self._block_mins[self._block] = self._block_min
            self._block = (self._block + 1) % FLOOR_BLOCKS
            self._block_fill = 0
            self._block_min = math.inf
            self._floor = min(self._block_mins)
        # In speech the floor may fall but not rise above where it was when speech started: a
        # long utterance's quietest stretch may still be speech.
        floor = max(FLOOR_MIN, min(self._floor, self._block_min, self._floor_cap))
        near = floor * self._near_ratio
        self._loud_noise = near * _LOUD_NOISE_RATIO
        if energy >= floor * self._voice_ratio:
            self._voice_end = end
        voiced = end - self._voice_end <= self._history or (
            self._in_speech and self._voice_end > self._started_at)
        self._faint = voiced and energy < self._loud_noise
        return voiced and energy < near

    def _on_window(self, p: float, near: bool, start: int, end: int, t_ns: int) -> None:
        """One window's verdicts: Silero's probability ``p``, and ``near``: the window is the
        line's noise, whatever Silero says (never true with the noise rule off). The noise
        only ends speech; starting it is Silero's alone."""
        cfg = self.cfg
        self.windows += 1
        self.last_prob = p
        speech = p >= cfg.threshold
        if speech:
            self.speech_windows += 1
        if not self._in_speech:
            if not speech or self._faint:  # the line's noise, which Silero may hear as speech
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
                self._floor_cap = min(self._floor, self._block_min)
                self.push(SpeechStarted(self._started_at), DOWN)
            return
        self._near_bits = (self._near_bits << 1 | near) & _NOISE_MASK
        if self._paused_at is None:
            if p < cfg.neg_threshold or self._near_bits.bit_count() >= NOISE_QUIET:
                self._paused_at = start
                voice_end = self._loud_end if self._voice_ended() else -1
                self.push(SpeechPaused(start, voice_end=voice_end), DOWN)
                self._maybe_stop(end)
            else:
                self._speech_end, self._speech_end_ns = end, t_ns
        elif speech and not near:
            self._paused_at = None
            self._speech_end, self._speech_end_ns = end, t_ns
            self.push(SpeechResumed(start), DOWN)  # the pause was mid-utterance
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
