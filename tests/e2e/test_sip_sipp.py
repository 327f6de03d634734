"""A real SIP peer calls the agent: sipp INVITEs voxline's SIP endpoint, streams a real 8 kHz
recording as μ-law RTP, presses a key (RFC 4733), and echoes the agent's RTP back (-rtp_echo);
the transcript matches the recording, the agent's spoken reply reached sipp, and BYE frees the
session. Traffic stays on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from telephony_checks import DATA, loud_frames, read_clip_8k, recall, require_sipp

from agent.commands.telephony import session_factory
from agent.config import Config
from agent.frames import Dtmf, Frame, Transcript
from agent.presets import load_models
from transports.g711 import ulaw_decode
from transports.sip.server import SipCall, SipServer

pytestmark = pytest.mark.slow
SCENARIO = DATA / "sipp" / "uac_speech.xml"
DTMF_PCAP = Path("/usr/share/sip-tester/dtmf_2833_5.pcap")


def free_port(kind: int = socket.SOCK_DGRAM, even: bool = False) -> int:
    while True:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not even or port % 2 == 0:
            return port


def write_scenario(tmp: Path, talk_ms: int) -> tuple[Path, Path]:
    import soundfile as sf

    wav = tmp / "caller_ulaw.wav"
    sf.write(wav, read_clip_8k(), 8000, subtype="ULAW")  # what sipp's rtp_stream wants
    xml = SCENARIO.read_text().replace("@WAV@", str(wav)).replace("@DTMF@", str(DTMF_PCAP))
    scenario = tmp / "caller.xml"
    scenario.write_text(xml.replace("@TALK_MS@", str(talk_ms)))
    return scenario, wav


@pytest.fixture(scope="module")
def models():
    require_sipp()
    return load_models(Config())


def test_sipp_calls_the_agent(models, tmp_path: Path) -> None:
    sipp = require_sipp()
    assert DTMF_PCAP.exists(), "sip-tester ships its DTMF pcaps in /usr/share/sip-tester"
    scenario, _ = write_scenario(tmp_path, talk_ms=14000)
    result = asyncio.run(_call(sipp, scenario, models, tmp_path))
    rc, out, report, frames, echoed, session = result
    assert rc == 0, f"sipp failed:\n{out[-3000:]}"

    # the call ended by the caller's BYE and freed its session
    assert report.reason == "bye" and session.closed
    # the caller's audio arrived whole (5.36 s = 268 packets) and was understood
    assert report.media.packets_in >= 260 and report.media.malformed == 0
    assert report.jitter["lost"] == 0
    finals = " ".join(f.text for f in frames if isinstance(f, Transcript) and f.final)
    assert recall(finals) >= 0.6, f"transcript {finals!r}"
    # the key press arrived once, despite the repeated RFC 4733 end packets
    assert [f.digit for f in frames if isinstance(f, Dtmf)] == ["5"]
    # the agent answered, and its voice reached sipp (it came back through -rtp_echo)
    assert report.media.agent_packets_out > 50
    agent_audio = ulaw_decode(b"".join(echoed))
    assert loud_frames(agent_audio) >= 25, "less than 0.5 s of audible agent speech at sipp"
    turns = [t for t in report.turns if t["type"] == "turn" and t["complete"]]
    assert turns and "voice_to_voice" in turns[0]["spans"]
    v2v = turns[0]["spans"]["voice_to_voice"]["ms"]
    print(f"\nSIP call: transcript {finals!r}; voice-to-voice {v2v:.0f} ms; "
          f"{report.media.packets_in} RTP in, {report.jitter}, "
          f"{report.media.agent_packets_out} agent packets out, {len(echoed)} echoed")


async def _call(sipp: str, scenario: Path, models, tmp: Path):
    cfg = Config()
    frames: list[Frame] = []
    calls: list[SipCall] = []

    def on_call(call: SipCall) -> None:
        call.media.echo_payloads = []
        call.session.listen(frames.append)
        calls.append(call)

    server = SipServer(session_factory(cfg, models), host="127.0.0.1", port=free_port(),
                       rtp_ports=(44000, 44998), on_call=on_call)
    host, port = await server.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            sipp, f"{host}:{port}", "-i", "127.0.0.1", "-p", str(free_port()),
            "-mi", "127.0.0.1", "-mp", str(free_port(even=True)), "-rtp_echo",
            "-sf", str(scenario), "-s", "agent", "-m", "1", "-l", "1", "-nostdin",
            "-timeout", "60s", "-trace_err",
            cwd=tmp, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 90)
        for _ in range(100):
            if server.reports:
                break
            await asyncio.sleep(0.05)
    finally:
        await server.stop()
    call = calls[0]
    echoed = [p for p in (call.media.echo_payloads or [])]
    return proc.returncode, out.decode(errors="replace"), server.reports[0], frames, echoed, \
        call.session
