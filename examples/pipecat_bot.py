"""A pipecat pipeline that hears with voxline: pipecat's VAD, voxline's streaming ASR as a
pipecat STT service, and — given an OpenAI-compatible server — pipecat's LLM service answering
each turn.
A recording plays in as the caller's microphone, in real time; the transcripts (interim and
final) and the agent's replies are printed as they come. Everything runs offline on the
embedded models (Silero VAD, Whisper tiny.en; SmolLM2 behind a local llama.cpp server).

Transcripts only (the ASR engine runs in this process):

    python examples/pipecat_bot.py [CALL.wav]

With replies, from SmolLM2 served by llama.cpp on this machine:

    python -m llama_cpp.server --port 8000 --model \\
        "$(python -c 'from stages.llm.local import smollm2_path; print(smollm2_path())')"
    python examples/pipecat_bot.py [CALL.wav] --llm-url http://127.0.0.1:8000/v1

With ``--socket PATH`` the STT streams to a running ``voxline asr-serve --socket PATH`` instead
of an engine in this process. The recording defaults to examples/audio/caller.wav; any file
voxline can read works (it is resampled to 16 kHz mono). Needs ``pip install 'voxline[pipecat]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.audio import read_audio  # noqa: E402
from agent.config import Config  # noqa: E402
from agent.frames import FRAME_SAMPLES, SAMPLE_RATE  # noqa: E402

CALLER = ROOT / "examples" / "audio" / "caller.wav"
TAIL_S = 3.5  # silence after the recording: past pipecat's longest end-of-turn wait (3 s)
REPLY_WAIT_S = 30.0  # how long the agent may take to answer that last turn


class Console:
    """Prints lines stamped with the seconds since the recording began to play, and counts the
    caller's turns and the agent's replies (the bot ends once every turn has its reply)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.turns = 0
        self.replies = 0
        self.answered = asyncio.Event()

    def show(self, who: str, text: str) -> None:
        print(f"{time.monotonic() - self.t0:6.2f} s  {who:<8} {text}", flush=True)

    def turn(self) -> None:
        self.turns += 1
        self.answered.clear()

    def reply(self, text: str) -> None:
        self.show("agent", text or "(interrupted: the caller went on speaking)")
        self.replies += 1
        if self.replies >= self.turns:
            self.answered.set()


def build_pipeline(args: argparse.Namespace, console: Console) -> Any:
    """VAD → voxline STT → printer; with an LLM, then → user turn → LLM → printer → assistant
    context."""
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import (
        InterimTranscriptionFrame,
        LLMFullResponseEndFrame,
        LLMTextFrame,
        TranscriptionFrame,
        UserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.processors.frame_processor import FrameProcessor

    from stages.adapters.pipecat_stt import VoxlineSTTService

    show = console.show

    class Transcripts(FrameProcessor):
        """Prints what the STT hears: interim transcripts as they firm up, then each final."""

        async def process_frame(self, frame: Any, direction: Any) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TranscriptionFrame):
                show("final", frame.text)
            elif isinstance(frame, InterimTranscriptionFrame):
                show("interim", frame.text)
            await self.push_frame(frame, direction)

    class Replies(FrameProcessor):
        """Counts the caller's turns (the user aggregator's end of each passes here), collects
        the LLM's streamed text and prints each reply once it is complete."""

        def __init__(self) -> None:
            super().__init__()
            self.text: list[str] = []

        async def process_frame(self, frame: Any, direction: Any) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, UserStoppedSpeakingFrame):
                console.turn()
            elif isinstance(frame, LLMTextFrame):
                self.text.append(frame.text)
            elif isinstance(frame, LLMFullResponseEndFrame):
                console.reply("".join(self.text).strip())
                self.text.clear()
            await self.push_frame(frame, direction)

    stt = VoxlineSTTService(socket_path=args.socket)
    processors: list[Any] = [VADProcessor(vad_analyzer=SileroVADAnalyzer()), stt, Transcripts()]
    if args.llm_url:
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
        from pipecat.services.openai.llm import OpenAILLMService

        class LocalLLMService(OpenAILLMService):
            """OpenAI's service for a local server: llama.cpp's chat schema has no "developer"
            role, which pipecat uses for its note after an interruption."""

            supports_developer_role = False

        llm_cfg = Config().llm  # voxline's prompt and reply length, for a like-for-like agent
        llm = LocalLLMService(api_key=args.api_key, base_url=args.llm_url,
                              settings=LocalLLMService.Settings(
                                  model=args.model, system_instruction=llm_cfg.system_prompt,
                                  max_tokens=llm_cfg.max_tokens, temperature=llm_cfg.temperature))
        context = LLMContextAggregatorPair(LLMContext())
        processors += [context.user(), llm, Replies(), context.assistant()]
    return Pipeline(processors)


async def run(args: argparse.Namespace) -> None:
    from pipecat.frames.frames import EndFrame, InputAudioRawFrame
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    if args.socket is None:
        from stages.adapters.pipecat_stt import shared_engine

        print("loading the ASR engine ...", file=sys.stderr, flush=True)
        await asyncio.to_thread(shared_engine)  # seconds, once per process: not on the loop
    pcm = read_audio(args.input)
    console = Console()
    worker = PipelineWorker(build_pipeline(args, console),
                            params=PipelineParams(audio_in_sample_rate=SAMPLE_RATE),
                            enable_rtvi=False, idle_timeout_secs=None)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def on_started(_worker: Any, _frame: Any) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.ensure_future(runner.run())
    await started.wait()
    # the microphone: 20-ms frames on a real-time clock, then silence so the last turn ends
    frame_s = FRAME_SAMPLES / SAMPLE_RATE
    silence = bytes(2 * FRAME_SAMPLES)
    n = -(-len(pcm) // FRAME_SAMPLES) + round(TAIL_S / frame_s)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    console.t0 = time.monotonic()
    for k in range(n):
        chunk = pcm[k * FRAME_SAMPLES:(k + 1) * FRAME_SAMPLES].tobytes()
        audio = chunk + silence[len(chunk):]
        await worker.queue_frame(
            InputAudioRawFrame(audio=audio, sample_rate=SAMPLE_RATE, num_channels=1))
        await asyncio.sleep(max(0.0, t0 + (k + 1) * frame_s - loop.time()))
    if args.llm_url and console.replies < console.turns:
        try:
            await asyncio.wait_for(console.answered.wait(), REPLY_WAIT_S)
        except TimeoutError:
            print(f"no reply within {REPLY_WAIT_S:g} s — is the LLM server at {args.llm_url} up?",
                  file=sys.stderr)
    await worker.queue_frame(EndFrame())  # the STT sends the finals it owes, then frees its slot
    await running


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", nargs="?", default=str(CALLER), help="the caller's recording")
    ap.add_argument("--llm-url", help="an OpenAI-compatible /v1 URL; without it, transcripts only")
    ap.add_argument("--model", default="smollm2", help="the model name sent to the LLM server")
    ap.add_argument("--api-key", default="none",
                    help="the LLM server's key (a local one needs none)")
    ap.add_argument("--socket", help="stream to `voxline asr-serve` at this Unix socket")
    ap.add_argument("--log-level", default="WARNING",
                    help="pipecat's log level (DEBUG shows every frame)")
    args = ap.parse_args()
    if importlib.util.find_spec("pipecat") is None:
        print("pipecat-ai is not installed — pip install 'voxline[pipecat]'", file=sys.stderr)
        return 2
    from loguru import logger  # pipecat's logger

    logger.remove()
    logger.add(sys.stderr, level=args.log_level)
    from agent.runtime import run as run_loop

    run_loop(run(args), Config().runtime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
