"""Soak: browser WebSocket calls and sipp calls, cycling for ``--minutes`` against one
``voxline serve --twilio`` and one ``voxline sip`` (both started here, on loopback); did every
call get its answer, and did the servers end as they began?

Each browser caller streams a real speech clip (../shared/data/speech) at real-time pace in
20-ms frames, waits for the agent's answer audio, hangs up with ``{"type": "hangup"}`` and the
next call takes its place; sipp keeps the SIP calls up the same way (a clip as μ-law RTP, the
line's quiet while the agent answers, BYE). ``--chaos`` cuts callers at a random moment
instead: ``--kill-fraction`` of the browser calls have their socket aborted (no close frame, no
hang-up), and every other sipp process places callers that vanish (RTP stops, no BYE), which
the server's ``--rtp-timeout`` must end. (``--twilio`` mounts the Twilio routes on the serve
process as in production; no Twilio calls are placed.)

Not every call reaches the agent's models: 2 cores hold about 14 such calls at once, so by
default 10 browser and 4 SIP calls of those up at once do (``--browser-agent-calls``,
``--sip-agent-calls``) and the rest call the servers' echo test (``--echo-test``: ``/ws/echo``
and ``sip:echo@…``, the caller's audio played back, no model), which loads the transports,
sessions and playout as a call does. An echo-test browser caller checks that every frame it
sent came back byte for byte and in order, and measures the round trip; a SIP one that the
server played back all it received (its end record).

The agent (``--agent echo``, the default, sized for 2 cores): the embedded Silero VAD and
Whisper tiny.en ASR (finals only, unless ``--partials-ms``), the VAD's silence as end of turn,
the soak's echo LLM (an OpenAI-compatible server in this process that says back the caller's
first words) through the real LLM stage and client, and eSpeak NG; SIP calls also get the echo
guard ([echo] auto). ``--agent full`` runs the embedded defaults instead.

Timeline: warm-up calls (the pools reach their working size), a slot probe (each server's
``--asr-slots`` S calls at once and one more, which must be refused), settle, **before**; the
run; settle, **after**, the probe again. Measured: calls started / completed / failed / lost
(lost: ended without the agent's answer, or with an unexpected error or close), audio frames
lost, sessions, free ASR slots (the probe), file descriptors (by kind) and threads before and
after, RSS every ``--sample-s`` and its drift over the run's second half, CPU seconds per
call-minute. Prints a line every 30 s, a table, and one JSON line; writes
benchmarks/results/soak.json.

    python benchmarks/soak.py                  # 50 browser + 20 SIP calls, 10 minutes
    python benchmarks/soak.py --chaos
    python benchmarks/soak.py --minutes 1 --browser-calls 8 --sip-calls 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from emit import emit  # noqa: E402
from soak_browser import CallOutcome, browser_call, hold_call, quiet_frames, speech_frames  # noqa: E402
from soak_llm import EchoLLM  # noqa: E402
from soak_metrics import fd_kinds, grown, leaked, rss_flatness, snapshot  # noqa: E402
from soak_sip import SipLedger, SippGroup, judge, read_lines, scenario, write_caller_wav  # noqa: E402

SPEECH = ROOT.parent / "shared" / "data" / "speech"
RESULT = ROOT / "benchmarks" / "results" / "soak.json"
BAR_RSS_DRIFT_PCT = 2.0
CLOSE_WAIT = "tcp close-wait"
SATURATED = 0.85  # of the machine's cores, used by the servers: answers are late from there on
START_TIMEOUT_S = 300.0  # loading the models on a busy machine
BROWSER_KINDS = ("read", "command")
CALL_LOG_KEEP = 100  # completed (and killed) browser calls the JSON lists, besides every lost one
CLIP_SECONDS = (2.0, 12.0)
# what a server does not report (tasks and ASR slots in use come from /healthz and from
# voxline sip's SIGUSR1 stats line; free slots are proved by the slot probe as well)
NOT_EXPOSED: tuple[str, ...] = ()
# the calls up at once that reach the agent's models, by default, on 2 cores (browser, SIP): the
# rest of --browser-calls and --sip-calls call the echo test (measured: see benchmarks/RESULTS.md)
AGENT_CALLS = (10, 4)
ECHO_DESC = ("the echo test (stages/echo_test.py: the caller's audio played back behind a "
             "200-ms jitter buffer, no model)")
AGENTS = {
    "echo": "VAD Silero + ASR Whisper tiny.en int8 (embedded; 1 thread per server, {partials}) "
            "+ end of turn by VAD silence + LLM: the soak's echo LLM "
            "(OpenAI-compatible, benchmarks/soak_llm.py) through the real LLM stage + TTS eSpeak NG",
    "full": "the embedded defaults: Silero VAD, Whisper tiny.en, Smart Turn, SmolLM2-135M "
            "(llama.cpp), Piper",
}


@dataclass(frozen=True, slots=True)
class Clip:
    id: str
    seconds: float
    pcm16k: np.ndarray
    pcm8k: np.ndarray | None  # the 8 kHz original of a telephone recording


@dataclass(slots=True)
class Server:
    name: str
    proc: asyncio.subprocess.Process
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(slots=True)
class Soak:
    args: argparse.Namespace
    tmp: Path
    rng: np.random.Generator
    clips: list[Clip]
    sip_clips: list[Clip]
    ledger: SipLedger = field(default_factory=SipLedger)
    outcomes: dict[str, list[CallOutcome]] = field(default_factory=dict)
    groups: dict[str, dict[int, SippGroup]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    phase: str = "start"
    t0: float = field(default_factory=time.monotonic)
    serve: Server | None = None
    sip: Server | None = None
    http_port: int = 0
    sip_port: int = 0
    llm: EchoLLM | None = None
    cores: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    warmup_cores: float = 0.0
    readers: list[asyncio.Task[None]] = field(default_factory=list)


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_clips(speech: Path) -> tuple[list[Clip], list[Clip]]:
    """Browser clips: read and command recordings of 2-12 s; SIP clips: the telephone
    recordings of that length (their 8 kHz originals) first, then the browser ones."""
    import soundfile as sf

    manifest = speech / "manifest.jsonl"
    if not manifest.exists():
        raise SystemExit(f"no speech set at {speech} (manifest.jsonl missing): pass --speech DIR")
    browser, phone = [], []
    for line in manifest.read_text().splitlines():
        item = json.loads(line)
        if not CLIP_SECONDS[0] <= item["duration_s"] <= CLIP_SECONDS[1]:
            continue
        pcm, _ = sf.read(speech / item["path"], dtype="int16")
        pcm8k = sf.read(speech / item["path_8k"], dtype="int16")[0] if item.get("path_8k") else None
        clip = Clip(item["id"], item["duration_s"], pcm, pcm8k)
        if pcm8k is not None:
            phone.append(clip)
        elif item["kind"] in BROWSER_KINDS:
            browser.append(clip)
    if not browser:
        raise SystemExit(f"no clips of {CLIP_SECONDS[0]:g}-{CLIP_SECONDS[1]:g} s in {manifest}")
    return browser, phone + browser


# --- the servers ---------------------------------------------------------------------------------
def agent_flags(args: argparse.Namespace, llm_url: str, tmp: Path) -> list[str]:
    if args.agent == "full":
        return []
    cfg = tmp / "soak.toml"
    cfg.write_text(
        "# benchmarks/soak.py --agent echo\n"
        f"[asr]\nthreads = 1\npartial_interval_ms = {args.partials_ms}\n"
        '[turn]\nmode = "vad"\n'
        f'[llm]\nbackend = "openai"\nbase_url = "{llm_url}"\ntimeout_s = 15.0\n'
        '[tts]\nbackend = "espeak"\n'
    )
    return ["--config", str(cfg)]


def slots(args: argparse.Namespace) -> tuple[int, int]:
    """ASR slots of each server: the calls it holds at once and a margin for calls whose
    successor connects while their session still closes (chaos: the vanished SIP callers the
    RTP timeout has not ended yet)."""
    b, n = args.browser_agent_calls, args.sip_agent_calls
    return b + max(2, b // 5), n + max(2, n // 5) + (n if args.chaos else 0)


def max_calls(args: argparse.Namespace) -> tuple[int, int]:
    """Each server's --max-calls: every call up (the echo test's too), the successors' margin,
    and one more, so that the slot probe's refusal is the ASR slots'."""
    slots_b, slots_s = slots(args)
    echo_b = args.browser_calls - args.browser_agent_calls
    echo_s = args.sip_calls - args.sip_agent_calls
    return (slots_b + echo_b + max(2, echo_b // 5) + 1,
            slots_s + echo_s + max(2, echo_s // 5) + (echo_s if args.chaos else 0) + 1)


async def start_servers(s: Soak) -> None:
    args = s.args
    s.llm = EchoLLM()
    llm_url = await s.llm.start() if args.agent == "echo" else ""
    flags = agent_flags(args, llm_url, s.tmp)
    slots_b, slots_s = slots(args)
    most_b, most_s = max_calls(args)
    s.http_port, s.sip_port = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_DGRAM)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    serve_cmd = ["serve", "--port", str(s.http_port), "--twilio", "--echo-test",
                 "--max-calls", str(most_b), "--max-calls-per-client", "0",
                 "--asr-slots", str(slots_b), *flags]
    sip_cmd = ["sip", "--json", "--port", str(s.sip_port), "--rtp-ports", args.rtp_ports,
               "--echo-test", "--max-calls", str(most_s), "--asr-slots", str(slots_s), *flags]
    if args.chaos:
        sip_cmd += ["--rtp-timeout", f"{args.rtp_timeout_s:g}"]
    for cmd in (serve_cmd, sip_cmd):
        print(f"  starting: voxline {' '.join(cmd)}", flush=True)
    log = s.tmp / "serve.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.cli", *serve_cmd, cwd=ROOT, env=env,
        stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT)
    s.serve = Server("serve", proc, log)
    log = s.tmp / "sip.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.cli", *sip_cmd, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    s.sip = Server("sip", proc, log)
    out = (s.tmp / "sip.jsonl").open("w")
    err = log.open("w")
    listening = asyncio.Event()

    def on_log(line: str) -> None:
        err.write(line + "\n")
        err.flush()
        if "listening on udp" in line:
            listening.set()

    assert proc.stdout is not None and proc.stderr is not None
    s.readers += [
        asyncio.create_task(read_lines(proc.stdout, s.ledger.feed, lambda ln: out.write(ln + "\n"))),
        asyncio.create_task(read_lines(proc.stderr, s.ledger.log_line, on_log)),
    ]
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (listening.is_set() and await health(s) is not None):
        for srv in (s.serve, s.sip):
            if srv.proc.returncode is not None:
                raise SystemExit(f"voxline {srv.name} exited with {srv.proc.returncode}:\n"
                                 + srv.log.read_text(errors="replace")[-3000:])
        if time.monotonic() > deadline:
            raise SystemExit(f"the servers did not start within {START_TIMEOUT_S:g} s (logs: {s.tmp})")
        await asyncio.sleep(0.5)


async def health(s: Soak) -> dict[str, Any] | None:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{s.http_port}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.json() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def stop_servers(s: Soak) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for srv in (s.serve, s.sip):
        if srv is None:
            continue
        if srv.proc.returncode is None:
            srv.proc.send_signal(signal.SIGTERM)
        try:
            codes[srv.name] = await asyncio.wait_for(srv.proc.wait(), 30)
        except TimeoutError:
            srv.proc.kill()
            codes[srv.name] = await srv.proc.wait()
            codes[srv.name + "_killed_after_sigterm"] = 1
    if s.llm is not None:
        await s.llm.stop()
    return codes


# --- load ------------------------------------------------------------------------------------------
async def browser_load(s: Soak, phase: str, calls: int, deadline: float) -> None:
    args = s.args
    url = f"ws://127.0.0.1:{s.http_port}/ws"
    quiet = quiet_frames(seed=args.seed)
    frames = {c.id: speech_frames(c.pcm16k) for c in s.clips}
    done = s.outcomes.setdefault(phase, [])

    async def caller(i: int) -> None:
        echo = i >= args.browser_agent_calls  # the first callers reach the agent, the rest the echo test
        await asyncio.sleep(i * 0.1)  # not all at once: a browser's users arrive over a while
        while time.monotonic() < deadline:
            clip = s.clips[int(s.rng.integers(len(s.clips)))]
            kill = None
            if args.chaos and s.rng.random() < args.kill_fraction:
                kill = float(s.rng.uniform(0.3, clip.seconds + 3.0))
            out = await browser_call(url + "/echo" if echo else url, clip.id, frames[clip.id],
                                     quiet, answer_timeout_s=args.answer_timeout_s,
                                     kill_at_s=kill, echo=echo)
            done.append(out)
            if out.status == "failed":
                await asyncio.sleep(1.0)  # a refusing server is not hammered

    await asyncio.gather(*(caller(i) for i in range(calls)))


def sip_groups(s: Soak, phase: str, calls: int) -> list[SippGroup]:
    """sipp processes for ``calls`` calls up at once: the agent's (``sip:agent@…``) and the
    echo test's (``sip:echo@…``), up to --sipp-groups of each."""
    args = s.args
    agent = min(calls, args.sip_agent_calls)
    groups = []
    for service, up in (("agent", agent), ("echo", calls - agent)):
        n = min(args.sipp_groups, up)
        for g in range(n):
            share = up // n + (1 if g < up % n else 0)
            kind = "vanish" if args.chaos and g % 2 == 1 else "normal"
            clip = s.sip_clips[g % len(s.sip_clips)]
            name = f"{phase}-{service}-{g}"
            wav = s.tmp / f"{name}-{clip.id}.wav"
            packets = write_caller_wav(clip.pcm16k, clip.pcm8k, args.sip_listen_s, wav, seed=g)
            talk_ms = packets * 20 + 300
            xml = s.tmp / f"{name}-{kind}.xml"
            xml.write_text(scenario(kind, wav, talk_ms))
            groups.append(SippGroup(name, kind, clip.id, xml, share, packets, talk_ms / 1000,
                                    service=service))
    return groups


async def sip_load(s: Soak, phase: str, calls: int, deadline: float) -> list[SippGroup]:
    groups = sip_groups(s, phase, calls)
    for i, g in enumerate(groups):
        await g.start(f"127.0.0.1:{s.sip_port}", free_port(socket.SOCK_DGRAM),
                      free_port(socket.SOCK_DGRAM), 1_000_000, max(1, g.calls), s.tmp / f"{g.name}.sipp.log")
        s.groups.setdefault(phase, {})[g.pid] = g
        await asyncio.sleep(0.5 if i < len(groups) - 1 else 0)
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    await asyncio.gather(*(g.finish(g.talk_s + 40) for g in groups))
    return groups


async def load(s: Soak, phase: str, seconds: float) -> None:
    s.phase = s.ledger.phase = phase
    deadline = time.monotonic() + seconds
    await asyncio.gather(browser_load(s, phase, s.args.browser_calls, deadline),
                         sip_load(s, phase, s.args.sip_calls, deadline))


async def probe(s: Soak, phase: str) -> dict[str, Any]:
    """Every ASR slot at once, and one call more: S calls must start and the last be refused
    (a slot that leaked makes one more refusal; a probe that refuses nothing measures nothing)."""
    s.phase = s.ledger.phase = phase
    slots_b, slots_s = slots(s.args)
    verdicts: list[str] = []
    release = asyncio.Event()
    url = f"ws://127.0.0.1:{s.http_port}/ws"
    holds = [asyncio.create_task(hold_call(url, verdicts, release)) for _ in range(slots_b + 1)]
    group = SippGroup(phase, "probe", "", s.tmp / f"{phase}.xml", slots_s + 1, 0, 0.0)
    hold_ms = int(1000 * ((slots_s + 1) / s.args.probe_rate + 4))
    quiet = s.tmp / f"{phase}.wav"
    write_caller_wav(None, np.zeros(0, np.int16), hold_ms / 1000 + 2, quiet)
    group.scenario.write_text(scenario("probe", quiet, hold_ms))
    await group.start(f"127.0.0.1:{s.sip_port}", free_port(socket.SOCK_DGRAM),
                      free_port(socket.SOCK_DGRAM), slots_s + 1, s.args.probe_rate,
                      s.tmp / f"{phase}.sipp.log")
    s.groups.setdefault(phase, {})[group.pid] = group
    until = time.monotonic() + 30
    while len(verdicts) < len(holds) and time.monotonic() < until:
        await asyncio.sleep(0.1)
    release.set()
    await asyncio.gather(*holds)
    await group.finish(hold_ms / 1000 + 40, stop=False)
    sipp = group.counts()
    records = s.ledger.phase_calls(phase)
    browser_ok = verdicts.count("admitted")
    sip_ok = sum(1 for r in records if not r.refused)
    return {
        "browser": {"slots": slots_b, "tried": slots_b + 1, "admitted": browser_ok,
                    "refused": [v for v in verdicts if v != "admitted"]},
        "sip": {"slots": slots_s, "tried": slots_s + 1, "admitted": sip_ok,
                "refused": sum(1 for r in records if r.refused), "sipp": sipp},
    }


# --- measuring -----------------------------------------------------------------------------------
async def settle(s: Soak, seconds: float, limit_s: float) -> float:
    """Wait until neither server has a call up (at most ``limit_s``), then ``seconds`` more
    (idle keep-alive connections close, closing sessions finish). Returns the seconds waited."""
    t = time.monotonic()
    while time.monotonic() - t < limit_s:
        require_alive(s)
        h = await health(s)
        if h is not None and h.get("calls") == 0 and s.ledger.active == 0:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(seconds)
    return round(time.monotonic() - t, 1)


def cpu_total(s: Soak) -> float:
    """Both servers' CPU seconds so far."""
    assert s.serve is not None and s.sip is not None
    return snapshot(s.serve.pid).cpu_s + snapshot(s.sip.pid).cpu_s


def require_alive(s: Soak) -> None:
    """A server that died is the soak's finding: stop, with the end of its log."""
    for srv in (s.serve, s.sip):
        if srv is not None and srv.proc.returncode is not None:
            raise SystemExit(f"voxline {srv.name} exited with {srv.proc.returncode} during the "
                             f"soak ({s.phase}); the end of its log ({srv.log}):\n"
                             + srv.log.read_text(errors="replace")[-3000:])


async def measure(s: Soak) -> dict[str, Any]:
    assert s.serve is not None and s.sip is not None
    require_alive(s)
    # /proc first: the /healthz request's own connection is open for a moment after it
    serve = {**snapshot(s.serve.pid).as_dict(), "fd_kinds": fd_kinds(s.serve.pid)}
    sip = {**snapshot(s.sip.pid).as_dict(), "fd_kinds": fd_kinds(s.sip.pid),
           "sessions": s.ledger.active}
    h = await health(s) or {}
    st = await sip_stats(s) or {}
    return {"serve": {**serve, "sessions": h.get("calls"), "tasks": h.get("tasks"),
                      "asr_slots_in_use": h.get("asr_slots_in_use"), "health": h},
            "sip": {**sip, "tasks": st.get("tasks"), "asr_slots_in_use": st.get("asr_slots_in_use"),
                    "stats": st}}


async def sip_stats(s: Soak, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """voxline sip's stats line: SIGUSR1, then the next ``stats`` record on its stdout."""
    assert s.sip is not None
    seen = s.ledger.stats_seen
    os.kill(s.sip.pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while s.ledger.stats_seen == seen and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return s.ledger.stats if s.ledger.stats_seen != seen else None


async def sampler(s: Soak) -> None:
    """RSS every --sample-s; a progress line every --progress-s."""
    assert s.serve is not None and s.sip is not None
    next_progress = s.t0 + s.args.progress_s
    while True:
        now = time.monotonic()
        try:
            row = {"t": round(now - s.t0, 1), "phase": s.phase,
                   "serve_mb": snapshot(s.serve.pid).rss_kb / 1024,
                   "sip_mb": snapshot(s.sip.pid).rss_kb / 1024}
        except (OSError, ValueError):  # gone, or a zombie without VmRSS
            return  # the run reports it (require_alive)
        s.samples.append(row)
        if now >= next_progress:
            next_progress += s.args.progress_s
            print(progress_line(s, row), flush=True)
        await asyncio.sleep(s.args.sample_s)


def progress_line(s: Soak, row: dict[str, Any]) -> str:
    b = s.outcomes.get(s.phase, [])
    counts = {k: sum(o.status == k for o in b) for k in ("completed", "lost", "failed", "killed")}
    sip = s.ledger.phase_calls(s.phase)
    ended = [r for r in sip if r.end is not None]
    return (f"[{row['t']:6.0f} s {s.phase}] browser {len(b)} done ({counts['completed']} ok, "
            f"{counts['lost']} lost, {counts['failed']} failed, {counts['killed']} killed), "
            f"sip {len(ended)} ended of {len(sip)}; RSS serve {row['serve_mb']:.1f} MB, "
            f"sip {row['sip_mb']:.1f} MB")


def percentiles(v2v_ms: list[float]) -> dict[str, Any]:
    """The servers' voice-to-voice spans (speech end -> first answer audio out), in ms."""
    if not v2v_ms:
        return {"voice_to_voice_p50_ms": None, "voice_to_voice_p95_ms": None}
    return {"voice_to_voice_p50_ms": round(statistics.median(v2v_ms)),
            "voice_to_voice_p95_ms": round(float(np.percentile(v2v_ms, 95)))}


def browser_summary(outcomes: list[CallOutcome]) -> dict[str, Any]:
    by = {k: sum(o.status == k for o in outcomes)
          for k in ("completed", "lost", "failed", "killed")}
    v2v = [x for o in outcomes for x in o.voice_to_voice_ms]
    echo = [o for o in outcomes if o.kind == "echo"]
    rtt = [x for o in echo for x in o.echo_rtt_ms]
    return {
        "started": len(outcomes) - by["failed"], **by,
        "echo_test_calls": len(echo),
        "echo_frames_lost": sum(o.echo_lost for o in echo),
        "echo_round_trip_p50_ms": round(statistics.median(rtt)) if rtt else None,
        "echo_round_trip_p95_ms": round(float(np.percentile(rtt, 95))) if rtt else None,
        "lost_reasons": sorted({o.reason for o in outcomes if o.status in ("lost", "failed")}),
        "frames_sent": sum(o.frames_sent for o in outcomes),
        "frames_dropped_by_server": sum(o.dropped_inbound for o in outcomes),
        "agent_frames_received": sum(o.agent_frames for o in outcomes),
        "call_minutes": round(sum(o.seconds for o in outcomes) / 60, 2),
        **percentiles(v2v),
    }


def call_log(outcomes: list[CallOutcome], keep: int = CALL_LOG_KEEP) -> list[dict[str, Any]]:
    """The run's browser calls as the JSON keeps them: every lost or failed one, and the first
    ``keep`` of each other status (thousands of calls alike tell no more than a hundred)."""
    seen: dict[str, int] = {}
    out = []
    for o in outcomes:
        seen[o.status] = seen.get(o.status, 0) + 1
        if o.status in ("lost", "failed") or seen[o.status] <= keep:
            out.append(o.as_dict())
    return out


def sip_summary(s: Soak, phase: str) -> dict[str, Any]:
    groups = s.groups.get(phase, {})
    records = s.ledger.phase_calls(phase)
    verdicts = [(r, *judge(r, groups.get(r.sipp_pid or -1))) for r in records]
    by = {k: sum(v == k for _, v, _ in verdicts) for k in ("completed", "lost", "failed", "killed")}
    sipp = [g.counts() for g in groups.values()]
    # a call sipp failed (an INVITE refused, a lost answer) that never got a session is in
    # sipp's count only; a refused one that did is in both
    by["failed"] = max(by["failed"], sum(c["failed"] or 0 for c in sipp))
    whole = [(r, groups[r.sipp_pid]) for r, v, _ in verdicts
             if v in ("completed", "lost") and r.end and r.sipp_pid in groups
             and groups[r.sipp_pid].kind == "normal"]
    sent = sum(g.packets for _, g in whole)
    received = sum(r.end["jitter"]["received"] for r, _ in whole)
    # per call: a call that got a packet more (sipp rounds its last one) hides no other's loss
    missing = sum(max(0, g.packets - r.end["jitter"]["received"]) for r, g in whole)
    return {
        "started": len(records) - by["failed"], **by,
        "echo_test_calls": sum(1 for r, _, _ in verdicts
                               if r.sipp_pid in groups and groups[r.sipp_pid].service == "echo"),
        "sipp": sipp,
        "lost_reasons": sorted({why for _, v, why in verdicts if v in ("lost", "failed")}),
        "rtp_sent": sent, "rtp_received": received, "rtp_missing": missing,
        "rtp_lost": sum(r.end["jitter"]["lost"] for r, _ in whole),
        "rtp_late": sum(r.end["jitter"]["late"] for r, _ in whole),
        "call_minutes": round(sum(r.end["seconds"] for r, _, _ in verdicts if r.end) / 60, 2),
        **percentiles([x for r in records for x in r.voice_to_voice_ms]),
    }


def server_report(before: dict[str, Any], after: dict[str, Any], probe_before: dict[str, Any],
                  probe_after: dict[str, Any], cpu_run_s: float, wall_s: float,
                  call_minutes: float, concurrent: int = 0) -> dict[str, Any]:
    """One server's before and after: a count that grew leaked, and so did a slot the probe
    after the run could not take that it took before."""
    keys = ("sessions", "fds", "threads", "tasks", "asr_slots_in_use")
    b = {k: before.get(k) for k in keys}
    a = {k: after.get(k) for k in keys}
    left = leaked(b, a)
    b["free_slots"], a["free_slots"] = probe_before["admitted"], probe_after["admitted"]
    left["free_slots"] = max(0, probe_before["admitted"] - probe_after["admitted"])
    # a socket whose peer closed and that this process never closed, after the settle: leaked,
    # however it got there (the warm-up included)
    b["close_wait"] = before["fd_kinds"].get(CLOSE_WAIT, 0)
    a["close_wait"] = left["close_wait"] = after["fd_kinds"].get(CLOSE_WAIT, 0)
    return {
        "before": b, "after": a, "leaked": left,
        "fds_grown": grown(before["fd_kinds"], after["fd_kinds"]),
        "rss_mb": {"before": round(before["rss_kb"] / 1024, 1), "after": round(after["rss_kb"] / 1024, 1)},
        "probe_valid": bool(probe_before["refused"]),
        "cpu_s": round(cpu_run_s, 1),
        "cores_used": round(cpu_run_s / wall_s, 2),
        # what each call up costs the server: times the calls a machine should hold, the cores
        "cores_per_call": round(cpu_run_s / wall_s / concurrent, 3) if concurrent else None,
        "cpu_s_per_call_minute": round(cpu_run_s / call_minutes, 2) if call_minutes else None,
    }


def print_table(res: dict[str, Any]) -> None:
    print()
    print(f"soak: {res['browser_calls']} browser + {res['sip_calls']} SIP calls for "
          f"{res['minutes']:g} min{' (chaos)' if res['chaos'] else ''}")
    a = res["agent_calls"]
    print(f"  {a['browser']} browser + {a['sip']} SIP of them reach the agent: {res['agent_desc']}")
    print(f"  the other {res['browser_calls'] - a['browser']} + {res['sip_calls'] - a['sip']} call "
          f"{res['echo_desc']}")
    print(f"{'calls':<12}{'started':>9}{'completed':>11}{'failed':>8}{'lost':>6}{'killed':>8}"
          f"{'call-min':>10}")
    for name in ("browser", "sip"):
        c = res["calls"][name]
        print(f"{name:<12}{c['started']:>9}{c['completed']:>11}{c['failed']:>8}{c['lost']:>6}"
              f"{c['killed']:>8}{c['call_minutes']:>10}")
    for name in ("browser", "sip"):
        for why in res["calls"][name]["lost_reasons"][:5]:
            print(f"  {name} lost/failed: {why}")
    b, sp = res["calls"]["browser"], res["calls"]["sip"]
    print(f"frames      browser: {b['frames_sent']} sent, {b['frames_dropped_by_server']} dropped "
          f"by the server (rate limit), agent: {b['agent_frames_received']} received, "
          f"{res['servers']['serve']['agent_frames_dropped']} dropped by the server (slow reader)")
    print(f"            sip (whole calls): {sp['rtp_sent']} RTP sent, {sp['rtp_received']} received "
          f"({sp['rtp_missing']} missing, {sp['rtp_lost']} lost, {sp['rtp_late']} late)")
    print(f"echo test   browser: {b['echo_test_calls']} calls, {b['echo_frames_lost']} frames "
          f"did not come back, round trip p50 / p95 {b['echo_round_trip_p50_ms']} / "
          f"{b['echo_round_trip_p95_ms']} ms (the caller's clock); sip: {sp['echo_test_calls']} "
          "calls")
    print(f"voice-to-voice (server trace) p50 / p95: browser {b['voice_to_voice_p50_ms']} / "
          f"{b['voice_to_voice_p95_ms']} ms, sip {sp['voice_to_voice_p50_ms']} / "
          f"{sp['voice_to_voice_p95_ms']} ms")
    print(f"{'server':<7}{'':<17}{'before':>7}{'after':>7}{'leaked':>7}")
    for name in ("serve", "sip"):
        r = res["servers"][name]
        for key in ("sessions", "free_slots", "asr_slots_in_use", "fds", "close_wait", "threads",
                    "tasks"):
            note = ""
            if key == "fds" and r["fds_grown"]:
                note = "  more: " + ", ".join(f"{n} {k}" for k, n in r["fds_grown"].items())
            if r["before"][key] is None:
                note = "  (not exposed)"
            cells = ["n/a" if r[c][key] is None else str(r[c][key])
                     for c in ("before", "after", "leaked")]
            print(f"{name:<7}{key[:16]:<17}" + "".join(f"{c:>7}" for c in cells) + note)
        f = r["rss_flatness"]
        print(f"{name:<7}RSS {r['rss_mb']['before']} -> {r['rss_mb']['after']} MB; second half "
              f"({f['from_s']}-{f['to_s']} s, {f['samples']} samples): drift {f['drift_pct']}%, "
              f"spread {f['spread_pct']}%; CPU {r['cpu_s']} s = {r['cpu_s_per_call_minute']} "
              f"s per call-minute, {r['cores_used']} cores ({r['cores_per_call']} a call)")
    print(f"machine: {res['cores']} cores, load average {res['load_average']['before']} before, "
          f"{res['load_average']['after']} after; the servers used {res['warmup_cores_used']} "
          "cores in the warm-up")
    if res["saturated"]:
        print(f"saturated: the servers used {res['warmup_cores_used']} of {res['cores']} cores in "
              "the warm-up")
    print("bars: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in res["bars"].items()))
    for note in res["not_exposed"]:
        print(f"  not exposed: {note}")


async def run(s: Soak) -> dict[str, Any]:
    args = s.args
    sampling: asyncio.Task[None] | None = None
    load_before = os.getloadavg()[0]
    try:
        await start_servers(s)
        sampling = asyncio.create_task(sampler(s))
        print(f"[{time.monotonic() - s.t0:6.0f} s] servers up (logs in {s.tmp}); load average "
              f"{load_before:.1f} on {s.cores} cores; warm-up {args.warmup_s:g} s", flush=True)
        if load_before > s.cores:
            print(f"WARNING: the machine's load average is {load_before:.1f} on {s.cores} cores "
                  "before the soak: other work competes with it", flush=True)
        cpu0, t_warm = cpu_total(s), time.monotonic()
        await load(s, "warmup", args.warmup_s)
        s.warmup_cores = round((cpu_total(s) - cpu0) / (time.monotonic() - t_warm), 2)
        if s.warmup_cores > SATURATED * s.cores:
            print(f"WARNING: the servers used {s.warmup_cores} of this machine's {s.cores} cores "
                  "during the warm-up: it is saturated, and late answers, lost frames or lost "
                  "calls below may be its capacity rather than a fault", flush=True)
        limit = (args.rtp_timeout_s if args.chaos else 0) + 60
        await settle(s, 1.0, limit)
        probe_before = await probe(s, "probe-before")
        print(f"[{time.monotonic() - s.t0:6.0f} s] probe: {json.dumps(probe_before)}", flush=True)
        await settle(s, args.settle_s, limit)
        before = await measure(s)
        t_run = time.monotonic()
        print(f"[{t_run - s.t0:6.0f} s] before: {json.dumps(before)}; run {args.minutes:g} min",
              flush=True)
        await load(s, "run", args.minutes * 60)
        t_end, t_drained = t_run + args.minutes * 60, time.monotonic()
        run_end = await measure(s)  # CPU up to the last call's end
        s.phase = "settle"
        settled = await settle(s, args.settle_s, limit)
        after = await measure(s)
        print(f"[{time.monotonic() - s.t0:6.0f} s] after ({settled} s settle): {json.dumps(after)}",
              flush=True)
        probe_after = await probe(s, "probe-after")
        print(f"[{time.monotonic() - s.t0:6.0f} s] probe: {json.dumps(probe_after)}", flush=True)
    finally:
        if sampling is not None:
            sampling.cancel()
        for groups in s.groups.values():  # after an error: no sipp may outlive the soak
            for g in groups.values():
                if g.proc is not None and g.proc.returncode is None:
                    g.proc.kill()
                    await g.proc.wait()
        codes = await stop_servers(s)
    browser = browser_summary(s.outcomes.get("run", []))
    sip = sip_summary(s, "run")
    servers = {}
    for name, callers, minutes, up in (
            ("serve", "browser", browser["call_minutes"], args.browser_calls),
            ("sip", "sip", sip["call_minutes"], args.sip_calls)):
        rep = server_report(before[name], after[name], probe_before[callers], probe_after[callers],
                            run_end[name]["cpu_s"] - before[name]["cpu_s"], t_drained - t_run,
                            minutes, up)
        rows = [(r["t"] + s.t0, r[f"{name}_mb"]) for r in s.samples]
        rep["rss_flatness"] = rss_flatness(rows, t_run, t_end)
        servers[name] = rep
    h0, h1 = before["serve"]["health"], after["serve"]["health"]
    servers["serve"]["agent_frames_dropped"] = (h1.get("dropped_audio_frames", 0)
                                                - h0.get("dropped_audio_frames", 0))
    servers["serve"]["served"] = h1.get("served", 0) - h0.get("served", 0)
    lost = browser["lost"] + sip["lost"]
    bars = {
        "0 calls lost": lost == 0 and browser["failed"] == 0 and sip["failed"] == 0,
        "0 leaked sessions/slots/fds/sockets/threads/tasks": all(
            r["probe_valid"] and not any(r["leaked"].values()) for r in servers.values()),
        f"RSS flat within {BAR_RSS_DRIFT_PCT:g}%": all(
            r["rss_flatness"]["drift_pct"] is not None
            and abs(r["rss_flatness"]["drift_pct"]) <= BAR_RSS_DRIFT_PCT for r in servers.values()),
    }
    return {
        "benchmark": "soak", "minutes": args.minutes, "chaos": args.chaos,
        "browser_calls": args.browser_calls, "sip_calls": args.sip_calls, "agent": args.agent,
        "agent_calls": {"browser": args.browser_agent_calls, "sip": args.sip_agent_calls},
        "echo_desc": ECHO_DESC,
        "agent_desc": AGENTS[args.agent].format(
            partials="finals only" if args.partials_ms >= 30000 else f"partials every {args.partials_ms} ms"),
        "kill_fraction": args.kill_fraction if args.chaos else 0.0,
        "rtp_timeout_s": args.rtp_timeout_s if args.chaos else None,
        "calls": {"browser": browser, "sip": sip},
        "warmup": {"browser": browser_summary(s.outcomes.get("warmup", [])),
                   "sip": sip_summary(s, "warmup")},
        "probes": {"before": probe_before, "after": probe_after},
        "servers": servers, "exit_codes": codes, "cores": s.cores,
        "warmup_cores_used": s.warmup_cores,
        "saturated": s.warmup_cores > SATURATED * s.cores, "bars": bars, "pass": all(bars.values()),
        "echo_llm_requests": s.llm.requests if s.llm else None,
        "echo_llm_abandoned": s.llm.abandoned if s.llm else None,
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "harness_cpu_s": round(time.process_time(), 1),
        "not_exposed": list(NOT_EXPOSED), "logs": str(s.tmp),
        "rss_samples": s.samples,
        "browser_call_log": call_log(s.outcomes.get("run", [])),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--browser-calls", type=int, default=50, help="browser calls up at once")
    ap.add_argument("--sip-calls", type=int, default=20, help="sipp calls up at once")
    ap.add_argument("--chaos", action="store_true",
                    help="cut --kill-fraction of the callers at a random moment instead")
    ap.add_argument("--kill-fraction", type=float, default=0.5)
    ap.add_argument("--rtp-timeout-s", type=float, default=5.0,
                    help="with --chaos: voxline sip --rtp-timeout (ends the vanished calls)")
    ap.add_argument("--browser-agent-calls", type=int, default=None, metavar="N",
                    help="of the browser calls up at once, how many reach the agent (its models); "
                         "the rest call the echo test (/ws/echo). Default: all when "
                         f"--browser-calls is at most {AGENT_CALLS[0]}, else {AGENT_CALLS[0]}")
    ap.add_argument("--sip-agent-calls", type=int, default=None, metavar="N",
                    help="the same for the SIP calls (the rest dial sip:echo@…). Default: all "
                         f"up to {AGENT_CALLS[1]}, else {AGENT_CALLS[1]}")
    ap.add_argument("--agent", choices=sorted(AGENTS), default="echo")
    ap.add_argument("--partials-ms", type=int, default=60000,
                    help="--agent echo: the ASR's partial interval (asr.partial_interval_ms); "
                         "the default leaves only finals, which 2 cores can afford (400: the "
                         "voxline default)")
    ap.add_argument("--warmup-s", type=float, default=30.0)
    ap.add_argument("--settle-s", type=float, default=10.0,
                    help="after the last call ended, before measuring")
    ap.add_argument("--answer-timeout-s", type=float, default=30.0,
                    help="a browser call that hears no answer this long after its clip is lost")
    ap.add_argument("--sip-listen-s", type=float, default=8.0,
                    help="how long a SIP caller stays on the line after its clip")
    ap.add_argument("--sipp-groups", type=int, default=4,
                    help="sipp processes (one clip each; with --chaos every other one vanishes)")
    ap.add_argument("--probe-rate", type=float, default=10.0, help="INVITEs a second of the slot probe")
    ap.add_argument("--rtp-ports", default="52000-53998", help="voxline sip --rtp-ports")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--progress-s", type=float, default=30.0)
    ap.add_argument("--speech", type=Path, default=SPEECH)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json-out", default=str(RESULT))
    args = ap.parse_args()
    for name, most in zip(("browser", "sip"), AGENT_CALLS, strict=True):
        calls, agent = getattr(args, f"{name}_calls"), getattr(args, f"{name}_agent_calls")
        agent = min(calls, most) if agent is None else agent
        if not 0 <= agent <= calls:
            ap.error(f"--{name}-agent-calls must be between 0 and --{name}-calls ({calls})")
        setattr(args, f"{name}_agent_calls", agent)
    clips, sip_clips = load_clips(args.speech)
    tmp = Path(tempfile.mkdtemp(prefix="voxline-soak-"))
    s = Soak(args, tmp, np.random.default_rng(args.seed), clips, sip_clips)
    res = asyncio.run(run(s))
    print_table(res)
    line = {k: v for k, v in res.items() if k not in ("rss_samples", "browser_call_log", "warmup")}
    emit(res, args.json_out, line)
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
