"""asr-serve I/O: 1,000 idle + 32 active Unix-socket connections on one event-loop thread.

Measures (1) the server's thread count, read from /proc/<pid>/task, before, during and after
the load; (2) dropped connections; (3) the latency the socket path adds over calling the engine
in-process (END sent → FINAL read, against submit → result), p50/p99; (4) handing a 10-minute
file over the socket versus through shared memory.

The server runs the real ``ASREngine`` + ``ASRServer`` in a subprocess, but with a cheap
deterministic backend (it returns each buffer's length after one pass over the samples), so the
model's own time does not drown the I/O cost being measured. Run:

    python3 benchmarks/asr_server_io.py [--idle 1000] [--active 32] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emit import emit  # noqa: E402

from agent.runtime import run  # noqa: E402
from stages.asr import wire  # noqa: E402
from stages.asr.backend import ASRCapabilities, Hypothesis  # noqa: E402
from stages.asr.engine import ASREngine  # noqa: E402
from stages.asr.long_audio import transcribe_long  # noqa: E402

RATE = 16_000
SPEECH = ROOT / "tests" / "data" / "ls-dev-clean-1272-128104-0000.wav"


class CountingBackend:
    """Deterministic and nearly free: one pass over the samples, the count as the text."""

    name = "counting"
    sample_rate = RATE
    max_batch = 16
    capabilities = ASRCapabilities(sample_rate=RATE, max_batch=16)

    def transcribe_batch(self, audio, prompts=None):  # noqa: ANN001, ANN201
        return [Hypothesis(f"{len(a)} {float(np.abs(a).mean()):.4f}") for a in audio]

    def warmup(self) -> None:
        pass


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def speech(seconds: float) -> np.ndarray:
    from agent.audio import read_audio

    clip = np.concatenate([read_audio(SPEECH), np.zeros(RATE // 2, np.int16)])
    reps = int(np.ceil(seconds * RATE / len(clip)))
    return np.tile(clip, reps)[: int(seconds * RATE)]


# --- the server side ---------------------------------------------------------------------------


async def serve(path: str, slots: int) -> None:
    from stages.asr.server import ASRServer

    engine = ASREngine(CountingBackend(), capacity=slots, max_seconds=30.0)
    server = ASRServer(engine)
    await server.start_unix(path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    print(json.dumps({"connections_at_stop": len(server.connections),
                      "protocol_errors": server.protocol_errors}), flush=True)
    await server.close()
    engine.close()


# --- the client side ---------------------------------------------------------------------------


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = wire.Decoder(1 << 22)
        self.sid = 0

    async def result(self, sid: int) -> wire.Message:
        while True:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            for msg in self.decoder.feed(data):
                if isinstance(msg, (wire.Final, wire.Error)) and msg.stream == sid:
                    return msg


async def connect_many(path: str, n: int, wave: int = 100) -> list[Conn]:
    conns: list[Conn] = []
    for at in range(0, n, wave):
        pairs = await asyncio.gather(*(asyncio.open_unix_connection(path)
                                       for _ in range(min(wave, n - at))))
        conns += [Conn(r, w) for r, w in pairs]
    return conns


def utterance(i: int) -> np.ndarray:
    """0.5 s of audio that differs per round, built once per round (not timed)."""
    rng = np.random.default_rng(i)
    return (rng.standard_normal(RATE // 2) * 2000).astype("<i2")


async def active_socket(conn: Conn, worker: int, rounds: int, lat: list[float]) -> None:
    rng = np.random.default_rng(1000 + worker)
    for r in range(rounds):
        conn.sid += 1
        sid = conn.sid
        pcm = utterance(worker * rounds + r)
        conn.writer.write(wire.encode_open(sid, {"partials": False}))
        for i in range(0, len(pcm), 1600):  # 100-ms frames
            conn.writer.write(wire.encode_audio(sid, pcm[i : i + 1600].tobytes()))
        await conn.writer.drain()
        t0 = time.perf_counter()
        conn.writer.write(wire.encode_end(sid))
        msg = await conn.result(sid)
        lat.append(time.perf_counter() - t0)
        if not isinstance(msg, wire.Final):
            raise RuntimeError(f"stream refused: {msg}")
        await asyncio.sleep(float(rng.uniform(0, 0.02)))


async def active_in_process(engine: ASREngine, worker: int, rounds: int, lat: list[float]) -> None:
    rng = np.random.default_rng(1000 + worker)
    for r in range(rounds):
        pcm = utterance(worker * rounds + r)
        slot = engine.open()
        try:
            for i in range(0, len(pcm), 1600):
                slot.append(pcm[i : i + 1600])
            t0 = time.perf_counter()
            hyp = await engine.submit(slot, slot.view(), final=True)
            lat.append(time.perf_counter() - t0)
            assert hyp is not None
        finally:
            engine.close_slot(slot)
        await asyncio.sleep(float(rng.uniform(0, 0.02)))


async def in_process_baseline(active: int, rounds: int) -> list[float]:
    engine = ASREngine(CountingBackend(), capacity=active, max_seconds=30.0)
    lat: list[float] = []
    await asyncio.gather(*(active_in_process(engine, w, rounds, lat) for w in range(active)))
    engine.close()
    return lat


async def handoff_socket(conn: Conn, sid: int, pcm: np.ndarray) -> float:
    t0 = time.perf_counter()
    conn.writer.write(wire.encode_open(sid, {"file": True, "partials": False}))
    for frame in wire.encode_audio_chunks(sid, memoryview(pcm).cast("B")):
        conn.writer.write(frame)
        await conn.writer.drain()
    conn.writer.write(wire.encode_end(sid))
    msg = await conn.result(sid)
    assert isinstance(msg, wire.Final), msg
    return time.perf_counter() - t0


async def handoff_shm(conn: Conn, sid: int, pcm: np.ndarray) -> tuple[float, float]:
    """(time to create the segment and write the PCM into it, time from then to FINAL)."""
    t0 = time.perf_counter()
    shm = shared_memory.SharedMemory(name=wire.shm_name(os.getpid(), os.urandom(8).hex()),
                                     create=True, size=pcm.nbytes)
    try:
        np.ndarray(len(pcm), np.int16, buffer=shm.buf)[:] = pcm
        t1 = time.perf_counter()
        conn.writer.write(wire.encode_shm(sid, shm.name, pcm.nbytes, len(pcm)))
        msg = await conn.result(sid)
        assert isinstance(msg, wire.Final), msg
        return t1 - t0, time.perf_counter() - t1
    finally:
        shm.close()
        shm.unlink()


async def handoff_in_process(pcm: np.ndarray) -> float:
    engine = ASREngine(CountingBackend(), capacity=1, max_seconds=1.0)
    slot = engine.open()
    t0 = time.perf_counter()
    await transcribe_long(engine, slot, pcm)
    dt = time.perf_counter() - t0
    engine.close()
    return dt


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q))


async def bench(args: argparse.Namespace) -> dict:
    nofile = raise_nofile()
    out: dict = {"nofile": nofile, "idle": args.idle, "active": args.active, "rounds": args.rounds}

    load_before = os.getloadavg()[0]
    base: list[float] = []
    sock = os.path.join(tempfile.mkdtemp(prefix="voxline-bench-"), "asr.sock")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", sock, "--slots", str(args.active + 8)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        counts = {"start": threads_of(proc.pid)}
        idle = await connect_many(sock, args.idle)
        counts["idle_connected"] = threads_of(proc.pid)
        active = await connect_many(sock, args.active)

        samples: list[int] = []

        async def sample_threads() -> None:
            while True:
                samples.append(threads_of(proc.pid))
                await asyncio.sleep(0.05)

        sampler = asyncio.ensure_future(sample_threads())
        lat: list[float] = []
        load_s = 0.0
        # in-process and socket blocks alternate, so both see the same (shared, noisy) machine
        per_block = max(1, args.rounds // args.blocks)
        for _ in range(args.blocks):
            base += await in_process_baseline(args.active, per_block)
            t0 = time.perf_counter()
            await asyncio.gather(*(active_socket(c, w, per_block, lat) for w, c in enumerate(active)))
            load_s += time.perf_counter() - t0
        sampler.cancel()
        counts["under_load_min"], counts["under_load_max"] = min(samples), max(samples)

        # every idle connection must still be there and answer a round trip
        dropped = sum(c.reader.at_eof() for c in idle)
        answered = 0
        for at in range(0, len(idle), args.active):
            async def ping(c: Conn) -> bool:
                c.writer.write(wire.encode_open(1, {"partials": False}) + wire.encode_audio(1, b"\0\0" * 160)
                               + wire.encode_end(1))
                return isinstance(await asyncio.wait_for(c.result(1), 30), wire.Final)
            answered += sum(await asyncio.gather(*(ping(c) for c in idle[at : at + args.active])))
        counts["after"] = threads_of(proc.pid)

        # a 10-minute file: socket versus shared memory (same chunking and batching after it)
        pcm = speech(600.0)
        hand = active[0]
        sock_t = [await handoff_socket(hand, 10_000 + i, pcm) for i in range(args.handoffs)]
        shm_t = [await handoff_shm(hand, 20_000 + i, pcm) for i in range(args.handoffs)]
        local_t = [await handoff_in_process(pcm) for _ in range(args.handoffs)]
        counts["end"] = threads_of(proc.pid)

        for c in idle + active:
            c.writer.close()
        proc.send_signal(signal.SIGTERM)
        tail = proc.communicate(timeout=30)[0].strip().splitlines()
        server_end = json.loads(tail[-1]) if tail else {}
    finally:
        if proc.poll() is None:
            proc.kill()

    out.update({
        "threads": counts,
        "threads_constant": len({counts["start"], counts["idle_connected"], counts["under_load_min"],
                                 counts["under_load_max"], counts["after"], counts["end"]}) == 1,
        "dropped_idle": int(dropped),
        "idle_answered": int(answered),
        "protocol_errors": server_end.get("protocol_errors"),
        "requests": len(lat),
        "load_s": round(load_s, 2),
        "in_process_ms": {"p50": round(pct(base, 50), 3), "p99": round(pct(base, 99), 3)},
        "socket_ms": {"p50": round(pct(lat, 50), 3), "p99": round(pct(lat, 99), 3)},
        "added_p50_ms": round(pct(lat, 50) - pct(base, 50), 3),
        "added_p99_ms": round(pct(lat, 99) - pct(base, 99), 3),
        "file_s": 600.0,
        "file_mb": round(len(pcm) * 2 / 1e6, 1),
        "handoff_socket_ms": round(float(np.median(sock_t)) * 1000, 1),
        "handoff_shm_ms": round(float(np.median([a + b for a, b in shm_t])) * 1000, 1),
        "shm_prepare_ms": round(float(np.median([a for a, _ in shm_t])) * 1000, 1),
        "shm_request_ms": round(float(np.median([b for _, b in shm_t])) * 1000, 1),
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "file_in_process_ms": round(float(np.median(local_t)) * 1000, 1),
    })
    return out


def table(r: dict) -> str:
    t = r["threads"]
    rows = [
        ("connections", f"{r['idle']} idle + {r['active']} active (RLIMIT_NOFILE {r['nofile']})"),
        ("server threads", f"start {t['start']}, {r['idle']} idle {t['idle_connected']}, under load "
                           f"{t['under_load_min']}–{t['under_load_max']}, after {t['after']}, end {t['end']}"
                           f" → {'constant' if r['threads_constant'] else 'CHANGED'}"),
        ("idle connections dropped", f"{r['dropped_idle']} (answered a round trip afterwards: "
                                     f"{r['idle_answered']}/{r['idle']})"),
        ("requests (active)", f"{r['requests']} in {r['load_s']} s; 1-min load average "
                              f"{r['loadavg_1min'][0]} → {r['loadavg_1min'][1]} on {os.cpu_count()} cores"),
        ("final latency in-process", f"p50 {r['in_process_ms']['p50']:.2f} ms, p99 {r['in_process_ms']['p99']:.2f} ms"),
        ("final latency over socket", f"p50 {r['socket_ms']['p50']:.2f} ms, p99 {r['socket_ms']['p99']:.2f} ms"),
        ("added by the socket path", f"p50 {r['added_p50_ms']:+.2f} ms, p99 {r['added_p99_ms']:+.2f} ms "
                                     f"({'under' if r['added_p99_ms'] < 5 else 'OVER'} the 5 ms bar)"),
        (f"{r['file_s'] / 60:.0f}-min file ({r['file_mb']} MB) over socket", f"{r['handoff_socket_ms']:.1f} ms"),
        (f"{r['file_s'] / 60:.0f}-min file via shared memory", f"{r['handoff_shm_ms']:.1f} ms = segment "
         f"create + write {r['shm_prepare_ms']:.1f} ms + SHM request to FINAL {r['shm_request_ms']:.1f} ms"),
        ("same file, engine in-process", f"{r['file_in_process_ms']:.1f} ms (chunking + batches, no hand-off)"),
    ]
    w = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--active", type=int, default=32)
    p.add_argument("--rounds", type=int, default=40, help="streams per active connection")
    p.add_argument("--handoffs", type=int, default=5, help="repetitions of each 10-min hand-off")
    p.add_argument("--blocks", type=int, default=4, help="alternating in-process/socket blocks")
    p.add_argument("--json-out", help="write the JSON result here too")
    p.add_argument("--serve", metavar="SOCKET", help=argparse.SUPPRESS)
    p.add_argument("--slots", type=int, default=64, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        raise_nofile()
        run(serve(args.serve, args.slots))
        return 0
    r = run(bench(args))
    print(table(r))
    emit({"benchmark": "asr_server_io", **r}, args.json_out)
    ok = r["threads_constant"] and r["dropped_idle"] == 0 and r["idle_answered"] == r["idle"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
