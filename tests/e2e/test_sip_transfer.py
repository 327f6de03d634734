"""Call control against a real SIP peer (sipp) on 127.0.0.1, with an idle agent (no models):
the agent blind-transfers the caller (REFER, 202, NOTIFY sipfrags, BYE) and the call ends as
"transferred"; the caller presses keys with sipp's own RFC 4733 generator and the session's
keypad gathers them; the agent presses keys and the caller's media socket decodes them."""

from __future__ import annotations

import asyncio
import json
import socket
from itertools import pairwise
from pathlib import Path

from telephony_checks import DATA, require_sipp

from agent.config import AgentConfig, LLMConfig
from agent.frames import UserTurnEnded
from agent.pipeline import Pipeline
from agent.session import Session
from agent.stage import Stage
from agent.tools import ToolCall, builtin_tools
from stages.llm.chat import LLMCapabilities
from stages.llm.stage import LLMStage
from transports.rtp.dtmf import DtmfReceiver, parse_telephone_event
from transports.rtp.packet import RtpPacket, parse_rtp
from transports.sip.server import SipCall, SipServer

SIPP = DATA / "sipp"


class Idle(Stage):
    """The agent of these tests: hears the call, says nothing."""

    name = "idle"

    def process(self, frame, direction) -> None:
        self.push(frame, direction)


def free_port(even: bool = False) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not even or port % 2 == 0:
            return port


async def established(server: SipServer, wait: float = 10.0) -> SipCall:
    for _ in range(int(wait / 0.02)):
        for call in server.calls.values():
            if call.session.control is not None:
                return call
        await asyncio.sleep(0.02)
    raise AssertionError("no call was established")


async def run_sipp(server: SipServer, scenario: Path, tmp: Path, agent, *sipp_args: str):
    """Start ``server``, run sipp with ``scenario`` against it while ``agent(call)`` drives the
    agent's side; returns (sipp's exit status, its output, the end report, agent's result)."""
    sipp = require_sipp()
    host, port = await server.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            sipp, f"{host}:{port}", "-i", "127.0.0.1", "-p", str(free_port()),
            "-mi", "127.0.0.1", "-mp", str(free_port(even=True)), *sipp_args,
            "-sf", str(scenario), "-s", "agent", "-m", "1", "-l", "1", "-nostdin",
            "-timeout", "20s", "-trace_err",
            cwd=tmp, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        try:
            result = await asyncio.wait_for(agent(await established(server)), 20)
            out, _ = await asyncio.wait_for(proc.communicate(), 25)
        except BaseException:
            if proc.returncode is None:
                proc.kill()
            out, _ = await proc.communicate()
            errors = "".join(p.read_text(errors="replace") for p in tmp.glob("*_errors.log"))
            print(f"sipp said:\n{out.decode(errors='replace')[-3000:]}{errors[-2000:]}")
            raise
        for _ in range(100):
            if server.reports:
                break
            await asyncio.sleep(0.05)
    finally:
        await server.stop()
    errors = "".join(p.read_text(errors="replace") for p in tmp.glob("*_errors.log"))
    return proc.returncode, out.decode(errors="replace") + errors, server.reports[0], result


def new_server(**options) -> SipServer:
    return SipServer(lambda: Session(Pipeline([Idle()])), host="127.0.0.1", port=free_port(),
                     rtp_ports=(45000, 45998), **options)


def test_the_agent_transfers_a_sipp_caller(tmp_path: Path) -> None:
    human = f"sip:human@127.0.0.1:{free_port()}"

    async def agent(call: SipCall) -> str:
        return await call.session.control.transfer(human)

    rc, out, report, said = asyncio.run(
        run_sipp(new_server(), SIPP / "uac_transfer.xml", tmp_path, agent))
    assert rc == 0, f"sipp failed:\n{out[-3000:]}"
    assert said == f"transferred to {human}"
    assert report.reason == "transferred"
    assert report.summary  # the session was closed and summarised (slot and RTP released)


class AsksForAPerson:
    """A model that answers any turn with a hand-over: words, then the transfer tool."""

    capabilities = LLMCapabilities(tools=True)

    async def stream(self, messages, tools=None, tool_choice=None):  # noqa: ANN001, ANN201
        yield "I'll put you through."
        yield [ToolCall("c1", "transfer_call", json.dumps({"target": self.target}))]

    def prefill(self, messages):  # noqa: ANN001, ANN201
        raise AssertionError

    def warmup(self) -> None:
        pass


def test_the_transfer_tool_sends_the_agent_s_refer_to_a_sipp_caller(tmp_path: Path) -> None:
    """The LLM stage's built-in transfer tool, not the test, asks for the hand-over."""
    human = f"sip:human@127.0.0.1:{free_port()}"
    model = AsksForAPerson()
    model.target = human
    stages: list[LLMStage] = []

    def make() -> Session:
        agent = AgentConfig(first_audio_wait_ms=0, preempt=False, prefill=False)
        stages.append(LLMStage(model, LLMConfig(), agent, tools=builtin_tools(["transfer_call"])))
        return Session(Pipeline([stages[-1]]))

    async def agent(call: SipCall) -> list[dict]:
        call.session.push(UserTurnEnded("Can I talk to a person?"))
        for _ in range(500):
            events = [e for e in call.session.trace.call_events if e["event"] == "tool_call"]
            if events:
                return events
            await asyncio.sleep(0.02)
        raise AssertionError("the tool never ran")

    server = SipServer(make, host="127.0.0.1", port=free_port(), rtp_ports=(45000, 45998))
    rc, out, report, events = asyncio.run(
        run_sipp(server, SIPP / "uac_transfer.xml", tmp_path, agent))
    assert rc == 0, f"sipp failed:\n{out[-3000:]}"
    assert [(e["tool"], e["outcome"]) for e in events] == [("transfer_call", "ok")]
    assert report.reason == "transferred"
    assert stages[0].history.entries[-1].content == f"transferred to {human}"


def keypad_scenario(tmp: Path, rtp_port: int, digits: str, talk_ms: int) -> Path:
    xml = (SIPP / "uac_keypad.xml").read_text()
    xml = xml.replace("@RTP_PORT@", str(rtp_port)).replace("@DIGITS@", digits)
    path = tmp / "keypad.xml"
    path.write_text(xml.replace("@TALK_MS@", str(talk_ms)))
    return path


def test_the_keypad_gathers_digits_a_sipp_caller_presses(tmp_path: Path) -> None:
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the caller's media address
    media.bind(("127.0.0.1", 0))

    async def agent(call: SipCall):
        return await call.session.keypad.gather(count=4, timeout_s=8.0)

    scenario = keypad_scenario(tmp_path, media.getsockname()[1], "1234", 2500)
    try:
        rc, out, report, got = asyncio.run(run_sipp(new_server(), scenario, tmp_path, agent))
    finally:
        media.close()
    assert rc == 0, f"sipp failed:\n{out[-3000:]}"
    assert (got.digits, got.reason) == ("1234", "count")
    assert report.media.dtmf == "1234" and report.reason == "bye"


def test_digits_the_agent_presses_reach_the_caller(tmp_path: Path) -> None:
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    media.setblocking(False)

    async def agent(call: SipCall) -> list[RtpPacket]:
        await call.session.keypad.gather(count=1, timeout_s=8.0)  # after sipp's own key
        await call.session.control.send_dtmf("12#", duration_ms=100, gap_ms=80)
        await asyncio.sleep(0.1)
        got = []
        while True:
            try:
                got.append(parse_rtp(media.recv(2048)))
            except BlockingIOError:
                return got

    scenario = keypad_scenario(tmp_path, media.getsockname()[1], "9", 2500)
    try:
        rc, out, report, packets = asyncio.run(run_sipp(new_server(), scenario, tmp_path, agent))
    finally:
        media.close()
    assert rc == 0, f"sipp failed:\n{out[-3000:]}"
    events = [p for p in packets if p.payload_type == 96]  # the offer's telephone-event
    rx = DtmfReceiver()
    assert "".join(k.digit for p in events for k in rx.feed(p.timestamp, p.payload)) == "12#"
    # per digit: marker on the first packet, the event's own timestamp, three end packets
    assert sum(p.marker for p in events) == 3 and len({p.timestamp for p in events}) == 3
    assert sum(parse_telephone_event(p.payload).end for p in events) == 9
    # one stream with the agent's audio: one SSRC, sequence numbers without a gap
    assert len({p.ssrc for p in packets}) == 1
    seqs = [p.sequence for p in packets]
    assert all((b - a) & 0xFFFF == 1 for a, b in pairwise(seqs))
    assert report.media.dtmf_sent == "12#" and report.media.dtmf == "9"
