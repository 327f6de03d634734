"""The soak's SIP callers and what it reads of ``voxline sip --json``: sipp scenarios (a caller
that streams a speech clip as μ-law RTP with ``rtp_stream``, listens, and BYEs; one that
vanishes mid-call, no BYE, its RTP stopped; one that only holds a call, for the slot probe),
sipp processes placing them in a loop, and a ledger of the server's per-call records."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_HEAD = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="voxline soak @KIND@">
  <send retrans="500">
    <![CDATA[

      INVITE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]soak[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=caller 1 1 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[local_ip_type] [local_ip]
      t=0 0
      m=audio [rtpstream_audio_port] RTP/AVP 0
      a=rtpmap:0 PCMU/8000

    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200" rtd="true"/>
  <send>
    <![CDATA[

      ACK sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]soak[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
"""
_STREAM = """  <nop><action><exec rtp_stream="@WAV@,1,0"/></action></nop>
"""
_BYE = """  <pause milliseconds="@TALK_MS@"/>
  <send retrans="500">
    <![CDATA[

      BYE sip:[service]@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: caller <sip:caller@[local_ip]:[local_port]>;tag=[pid]soak[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 BYE
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
  <recv response="200"/>
</scenario>
"""
# the phone is gone at a random moment of its call: RTP stops, no BYE ever comes; the server's
# RTP inactivity timeout must end the call and free its session
_VANISH = """  <pause distribution="uniform" min="300" max="@TALK_MS@"/>
  <nop><action><exec rtp_stream="pause"/></action></nop>
</scenario>
"""
KINDS = ("normal", "vanish", "probe")
ECHO_SAMPLES_PER_PACKET = 320  # a 20-ms RTP packet, in the pipeline's 16 kHz samples
ECHO_SLACK_SAMPLES = 1600  # 100 ms: what the call's resampler may still hold at the BYE
QUIET_RMS = 12.0  # the line's noise after the clip (about -69 dBFS), never digital silence
_CALL_ID = re.compile(r"^\d+-(\d+)@")
_REFUSED = re.compile(r"call (\S+) refused")


def scenario(kind: str, wav: Path | None, talk_ms: int) -> str:
    """The sipp XML for a caller of ``kind`` (sipp expands no variables inside exec actions,
    so the WAV's path and the talk time are written in). The probe's caller streams ``wav``
    too (the line's quiet), so no RTP timeout ends it while it holds its slot."""
    if kind not in KINDS:
        raise ValueError(f"unknown sipp caller {kind!r} (known: {', '.join(KINDS)})")
    if wav is None:
        raise ValueError(f"a {kind} caller streams a WAV: pass one")
    body = _HEAD + _STREAM.replace("@WAV@", str(wav)) + (_VANISH if kind == "vanish" else _BYE)
    return body.replace("@KIND@", kind).replace("@TALK_MS@", str(talk_ms))


def write_caller_wav(pcm16k: np.ndarray | None, pcm8k: np.ndarray | None, quiet_s: float,
                     path: Path, seed: int = 0) -> int:
    """The clip as sipp's ``rtp_stream`` wants it (8 kHz μ-law WAV), the line's quiet after it
    for ``quiet_s``; returns the RTP packets it makes (20 ms each)."""
    import soundfile as sf

    if pcm8k is None:
        import soxr

        if pcm16k is None:
            raise ValueError("write_caller_wav needs the clip at 16 kHz or at 8 kHz")
        pcm8k = soxr.resample(pcm16k.astype(np.float32), 16000, 8000).astype(np.float32)
        pcm8k = np.clip(np.round(pcm8k), -32768, 32767).astype(np.int16)
    rng = np.random.default_rng(seed)
    quiet = np.clip(rng.standard_normal(int(quiet_s * 8000)) * QUIET_RMS, -32768, 32767)
    audio = np.concatenate([pcm8k.astype(np.int16), quiet.astype(np.int16)])
    sf.write(path, audio, 8000, subtype="ULAW")
    return -(-len(audio) // 160)


def sipp_binary() -> str:
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp is not installed: apt-get install -y sip-tester")
    return sipp


@dataclass(slots=True)
class SippGroup:
    """One sipp process keeping ``calls`` calls of one scenario up, one after another."""

    name: str
    kind: str
    clip: str
    scenario: Path
    calls: int
    packets: int  # RTP packets one whole call streams (0: none)
    talk_s: float
    service: str = "agent"  # the Request-URI's user: the agent, or "echo" (the echo test)
    proc: asyncio.subprocess.Process | None = None
    log: Path | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, target: str, sip_port: int, media_port: int, total: int, rate: float,
                    log: Path) -> None:
        """Place ``total`` calls (at most ``calls`` at once, ``rate`` new ones a second)."""
        self.log = log
        self.proc = await asyncio.create_subprocess_exec(
            sipp_binary(), target, "-i", "127.0.0.1", "-p", str(sip_port),
            "-mi", "127.0.0.1", "-mp", str(media_port), "-sf", str(self.scenario), "-s", self.service,
            "-m", str(total), "-l", str(self.calls), "-r", f"{rate:g}", "-rp", "1000",
            "-f", "5", "-nostdin", "-recv_timeout", "30000",
            cwd=log.parent, stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT,
        )

    async def finish(self, grace_s: float, stop: bool = True) -> int:
        """Let the calls up end, placing no more (``stop``: SIGUSR1, sipp's soft exit; else once
        it has placed all it was asked for); killed when that takes longer than ``grace_s``.
        Returns sipp's exit status."""
        assert self.proc is not None
        if stop and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGUSR1)
        try:
            return await asyncio.wait_for(self.proc.wait(), grace_s)
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()

    def counts(self) -> dict[str, int | None]:
        """sipp's own final counts: calls created, successful, failed."""
        text = self.log.read_bytes().decode(errors="replace") if self.log else ""
        out: dict[str, int | None] = {}
        for key, label in (("created", "Outgoing calls created"), ("successful", "Successful call"),
                           ("failed", "Failed call")):
            found = re.findall(rf"{label}\s*\|\s*\d+\s*\|\s*(\d+)", text)
            out[key] = int(found[-1]) if found else None
        return out


@dataclass(slots=True)
class SipCallRecord:
    """One call as ``voxline sip --json`` told it."""

    session: str
    sip_call_id: str
    sipp_pid: int | None
    phase: str
    answered: bool = False  # a complete turn whose reply audio left the server
    turns: int = 0
    voice_to_voice_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    end: dict[str, Any] | None = None
    refused: bool = False  # set up, then refused (no ASR slot): no end record comes


class SipLedger:
    """Reads the server's stdout (``--json``) and log, line by line; knows every call."""

    def __init__(self) -> None:
        self.calls: dict[str, SipCallRecord] = {}
        self.by_sip_id: dict[str, SipCallRecord] = {}
        self.phase = "start"
        self.unparsed = 0
        self.stats: dict[str, Any] = {}  # the server's last stats line (SIGUSR1)
        self.stats_seen = 0

    def feed(self, line: str) -> None:
        try:
            ev = json.loads(line)
        except ValueError:
            self.unparsed += 1
            return
        if not isinstance(ev, dict):
            self.unparsed += 1
            return
        sid = str(ev.get("call", ""))
        kind = ev.get("type")
        if kind == "stats":
            self.stats, self.stats_seen = ev, self.stats_seen + 1
            return
        if kind == "call" and ev.get("state") == "ringing":
            cid = str(ev.get("sip_call_id", ""))
            m = _CALL_ID.match(cid)
            rec = SipCallRecord(sid, cid, int(m.group(1)) if m else None, self.phase)
            self.calls[sid] = rec
            self.by_sip_id[cid] = rec
            return
        rec = self.calls.get(sid)
        if rec is None:
            return
        if kind == "call" and ev.get("state") == "ended":
            rec.end = ev
        elif kind == "trace" and ev.get("kind") == "turn":
            rec.turns += 1
            span = (ev.get("spans") or {}).get("voice_to_voice")
            if ev.get("complete") and isinstance(span, dict):
                rec.answered = True
                rec.voice_to_voice_ms.append(float(span.get("ms", 0.0)))
        elif kind == "error":
            rec.errors.append(str(ev.get("message", ""))[:200])

    def log_line(self, line: str) -> None:
        m = _REFUSED.search(line)
        if m and m.group(1) in self.by_sip_id:
            self.by_sip_id[m.group(1)].refused = True

    @property
    def active(self) -> int:
        """Calls the server set up and has not ended: its live sessions."""
        return sum(1 for r in self.calls.values() if r.end is None and not r.refused)

    def phase_calls(self, phase: str) -> list[SipCallRecord]:
        return [r for r in self.calls.values() if r.phase == phase]


def judge(rec: SipCallRecord, group: SippGroup | None) -> tuple[str, str]:
    """(status, reason) of one SIP call of the run: as ``CallOutcome.status`` for browser calls."""
    if rec.refused:
        return "failed", "refused by the server"
    if group is not None and group.kind == "vanish":
        if rec.end is None:
            return "lost", "the vanished caller's call never ended"
        if rec.end.get("reason") != "rtp-timeout":
            return "lost", f"the vanished caller's call ended by {rec.end.get('reason')}"
        return "killed", ""
    if rec.end is None:
        return "lost", "still up after the run"
    if rec.errors:
        return "lost", "unexpected error: " + rec.errors[0]
    if rec.end.get("reason") != "bye":
        return "lost", f"ended by {rec.end.get('reason')}, not the caller's BYE"
    if group is not None and group.service == "echo":
        return judge_echo(rec.end)
    if not rec.answered:
        return "lost", "no answer"
    return "completed", ""


def judge_echo(end: dict[str, Any]) -> tuple[str, str]:
    """An echo-test call: everything the server received went back (less what its resampler
    still held at the BYE), nothing was dropped."""
    echo = end.get("echo_test")
    if not isinstance(echo, dict):
        return "lost", "the end record has no echo_test counts"
    received = end["jitter"]["received"] * ECHO_SAMPLES_PER_PACKET
    if echo.get("dropped_samples"):
        return "lost", f"the echo test dropped {echo['dropped_samples']} samples"
    if echo.get("echoed_samples", 0) < received - ECHO_SLACK_SAMPLES:
        return "lost", (f"the echo test played back {echo.get('echoed_samples')} of "
                        f"{received} samples")
    return "completed", ""


async def read_lines(stream: asyncio.StreamReader, *sinks: Any) -> None:
    """Hand every line of ``stream`` to each sink (until EOF)."""
    while True:
        raw = await stream.readline()
        if not raw:
            return
        line = raw.decode(errors="replace").rstrip("\n")
        for sink in sinks:
            sink(line)

