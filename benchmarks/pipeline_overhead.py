"""Per-frame cost of voxline's core: 20,000 frames of 20 ms, 16 kHz audio through 5 pass-through
stages, closed loop (one frame in flight) and burst (all frames pushed back to back).

Optionally runs the same workload through pipecat in another interpreter, side by side in the
same run (``--pipecat-python /path/to/venv/bin/python`` with pipecat-ai installed there), and
prints the throughput ratio. Prints a table and one JSON line; ``--json-out`` writes it too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emit import emit  # noqa: E402

from agent.frames import AudioIn, Direction  # noqa: E402
from agent.pipeline import Pipeline  # noqa: E402
from agent.stage import Stage  # noqa: E402

DOWN = Direction.DOWNSTREAM


class PassThrough(Stage):
    """The base class's process() forwards the frame: the pure cost of a hop."""


def run_voxline(n: int, stages: int) -> dict[str, float]:
    pcm = np.zeros(320, dtype=np.int16)
    arrivals: list[int] = []
    out_append = arrivals.append

    def on_out(frame: AudioIn) -> None:
        out_append(time.perf_counter_ns())

    p = Pipeline([PassThrough(f"s{i}") for i in range(stages)], on_output=on_out)
    push = p.push
    # closed loop: make the frame, push it, it has arrived when push returns
    lat = np.empty(n, dtype=np.int64)
    t_start = time.perf_counter_ns()
    for i in range(n):
        t0 = time.perf_counter_ns()
        push(AudioIn(pcm, offset=i * 320), DOWN)
        lat[i] = arrivals[-1] - t0
    closed_s = (time.perf_counter_ns() - t_start) / 1e9
    # burst: frames made up front, pushed back to back
    arrivals.clear()
    frames = [AudioIn(pcm, offset=i * 320) for i in range(n)]
    t_start = time.perf_counter_ns()
    for f in frames:
        push(f, DOWN)
    burst_s = (time.perf_counter_ns() - t_start) / 1e9
    assert len(arrivals) == n
    return {
        "closed_fps": n / closed_s,
        "burst_fps": n / burst_s,
        "p50_us": float(np.percentile(lat, 50)) / 1e3,
        "p99_us": float(np.percentile(lat, 99)) / 1e3,
    }


PIPECAT_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import numpy as np
    from pipecat.frames.frames import InputAudioRawFrame, EndFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineTask, PipelineParams
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

    N, STAGES, OBSERVERS = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"

    class Pass(FrameProcessor):
        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            await self.push_frame(frame, direction)

    class Sink(FrameProcessor):
        def __init__(self):
            super().__init__()
            self.t = []
            self.done = asyncio.Event()
            self.ev = None
        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, InputAudioRawFrame):
                self.t.append(time.perf_counter_ns())
                if self.ev is not None:
                    self.ev.set()
                if len(self.t) >= N:
                    self.done.set()
            await self.push_frame(frame, direction)

    async def main():
        sink = Sink()
        pipe = Pipeline([Pass() for _ in range(STAGES)] + [sink])
        params = PipelineParams(enable_metrics=False) if not OBSERVERS else PipelineParams()
        task = PipelineTask(pipe, params=params, enable_rtvi=False) if "enable_rtvi" in PipelineTask.__init__.__code__.co_varnames else PipelineTask(pipe, params=params)
        runner = PipelineRunner(handle_sigint=False)
        run = asyncio.create_task(runner.run(task))
        await asyncio.sleep(0.5)
        pcm = np.zeros(320, dtype=np.int16).tobytes()
        mk = lambda: InputAudioRawFrame(audio=pcm, sample_rate=16000, num_channels=1)
        lat = []
        t_start = time.perf_counter_ns()
        for i in range(N):
            sink.ev = asyncio.Event()
            t0 = time.perf_counter_ns()
            await task.queue_frame(mk())
            await sink.ev.wait()
            lat.append(sink.t[-1] - t0)
        closed = N / ((time.perf_counter_ns() - t_start) / 1e9)
        sink.ev = None
        sink.t.clear(); sink.done.clear()
        frames = [mk() for _ in range(N)]
        t_start = time.perf_counter_ns()
        for f in frames:
            await task.queue_frame(f)
        await sink.done.wait()
        burst = N / ((time.perf_counter_ns() - t_start) / 1e9)
        await task.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(run, 10)
        except Exception:
            run.cancel()
        lat = np.array(lat)
        print(json.dumps({"closed_fps": closed, "burst_fps": burst,
                          "p50_us": float(np.percentile(lat, 50)) / 1e3,
                          "p99_us": float(np.percentile(lat, 99)) / 1e3}))

    asyncio.run(main())
    """
)


def run_pipecat(python: str, n: int, stages: int, observers: bool) -> dict[str, float] | None:
    try:
        r = subprocess.run([python, "-c", PIPECAT_SCRIPT, str(n), str(stages), "1" if observers else "0"],
                           capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"pipecat run failed: {exc}", file=sys.stderr)
        return None
    if r.returncode != 0:
        print(f"pipecat run failed:\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--stages", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs for voxline")
    ap.add_argument("--pipecat-python", help="an interpreter with pipecat-ai installed")
    ap.add_argument("--json-out", help="write the JSON result here too")
    args = ap.parse_args()

    runs = [run_voxline(args.frames, args.stages) for _ in range(args.repeat)]
    vox = max(runs, key=lambda r: r["burst_fps"])
    rows = [("voxline", vox)]
    result: dict[str, object] = {"benchmark": "pipeline_overhead", "frames": args.frames,
                                 "stages": args.stages, "voxline": vox}
    if args.pipecat_python:
        for observers in (True, False):
            pc = run_pipecat(args.pipecat_python, args.frames, args.stages, observers)
            if pc:
                name = "pipecat (defaults)" if observers else "pipecat (metrics off)"
                rows.append((name, pc))
                result[name] = pc
                result[f"ratio_burst_vs_{'pipecat_defaults' if observers else 'pipecat_metrics_off'}"] = (
                    vox["burst_fps"] / pc["burst_fps"])
    print(f"{args.frames} frames of 20 ms through {args.stages} pass-through stages "
          f"(perf_counter_ns, one process, {asyncio.__name__} not involved for voxline: direct calls)")
    print(f"{'pipeline':<24}{'closed fps':>14}{'burst fps':>14}{'p50 µs':>10}{'p99 µs':>10}")
    for name, r in rows:
        print(f"{name:<24}{r['closed_fps']:>14,.0f}{r['burst_fps']:>14,.0f}{r['p50_us']:>10.2f}{r['p99_us']:>10.2f}")
    for k, v in result.items():
        if k.startswith("ratio"):
            print(f"{k}: {v:.1f}x")
    emit(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
