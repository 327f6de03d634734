"""Tool turns in the LLM stage, with a scripted model: the calls run (in parallel, each within
its limit), their results join the history in order and the model is asked again; errors and
timeouts go back to the model; a filler covers a slow tool; a barge-in cancels the reply and
the tools without side effects while one with side effects finishes into the history; nothing
runs on a speculative turn; a tool can hang up; and every call is traced."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator
from typing import Annotated, Any

import numpy as np
import pytest

from agent.config import AgentConfig, LLMConfig
from agent.frames import (
    Frame,
    HangUp,
    Interrupt,
    LLMEnd,
    SpeechStarted,
    TextToSpeak,
    TurnCandidate,
    UserTurnEnded,
)
from agent.pipeline import Pipeline
from agent.session import Session
from agent.tools import ToolCall, ToolContext, Tools, builtin_tools, tool
from stages.llm.chat import LLMCapabilities
from stages.llm.stage import CANCELLED, LLMStage

Step = list[Any]  # str tokens and list[ToolCall] items, as a backend's stream yields them


class ToolScriptLLM:
    """Answers each request with the next scripted step; records what each request sent."""

    capabilities = LLMCapabilities(tools=True)

    def __init__(self, *steps: Step, delay_s: float = 0.0) -> None:
        self.steps = list(steps)
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []

    async def stream(self, messages: list[dict[str, Any]], tools: Any = None,
                     tool_choice: Any = None) -> AsyncGenerator[Any, None]:
        self.requests.append({"messages": [dict(m) for m in messages], "tools": tools,
                              "tool_choice": tool_choice})
        step = self.steps.pop(0) if self.steps else ["Okay."]
        for item in step:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield item

    def prefill(self, messages: list[dict[str, Any]]) -> asyncio.Future[None]:
        raise AssertionError("no prefill")

    def warmup(self) -> None:
        pass


def call(tool_name: str, cid: str = "c1", **args: Any) -> ToolCall:
    return ToolCall(cid, tool_name, json.dumps(args))


class Harness:
    def __init__(self, llm: ToolScriptLLM, tools: Tools, **agent: Any) -> None:
        # (first chunks of 2-4 words: the chunks these expectations were written for)
        options = {"first_audio_wait_ms": 0, "preempt": False, "prefill": False,
                   "filler_delay_ms": 5_000, "min_first_chunk_words": 2,
                   "max_first_chunk_words": 4, **agent}
        self.llm = llm
        self.stage = LLMStage(llm, LLMConfig(tool_timeout_s=2.0), AgentConfig(**options),
                              tools=tools)
        self.session = Session(Pipeline([self.stage]))
        self.out: list[Frame] = []
        self.session.listen(self.out.append, frozenset({TextToSpeak, LLMEnd, HangUp}))

    @property
    def spoken(self) -> list[str]:
        return [f.text for f in self.out if isinstance(f, TextToSpeak)]

    @property
    def ends(self) -> list[LLMEnd]:
        return [f for f in self.out if isinstance(f, LLMEnd)]

    async def until(self, ok, timeout: float = 5.0) -> None:  # noqa: ANN001
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not ok():
            assert loop.time() < end, "timed out"
            await asyncio.sleep(0.005)

    def tool_events(self) -> list[dict[str, Any]]:
        return [e for e in self.session.trace.call_events if e["event"] == "tool_call"]


def run(coro) -> None:  # noqa: ANN001
    asyncio.run(coro)


# --- the tools used below --------------------------------------------------------------------
FREE = {"18:00": 2, "19:00": 4}
BOOKED: list[tuple[str, int, str]] = []


@tool
def check_slots(party_size: Annotated[int, "guests"]) -> str:
    """Which times have a table for the party."""
    return ", ".join(t for t, seats in FREE.items() if seats >= party_size) or "none"


@tool(side_effects=True)
async def book(name: str, party_size: int, time: str) -> str:
    """Book a table."""
    await asyncio.sleep(0.05)
    BOOKED.append((name, party_size, time))
    return f"booked {party_size} at {time} for {name}"


def test_a_tool_call_runs_and_the_model_answers_from_its_result() -> None:
    async def main() -> None:
        llm = ToolScriptLLM(["Let me check.", [call("check_slots", party_size=4)]],
                            ["We have", " a table at 19:00."])
        h = Harness(llm, Tools([check_slots]))
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("A table for four?"))
            await h.until(lambda: h.ends)
            assert " ".join(h.spoken) == "Let me check. We have a table at 19:00."
            assert h.ends[-1].text == "Let me check. We have a table at 19:00."
            first, second = llm.requests
            assert first["tools"][0]["function"]["name"] == "check_slots"
            assert first["tool_choice"] is None  # auto
            sent = second["messages"][-3:]
            assert sent[0]["role"] == "user"
            assert sent[1]["role"] == "assistant" and sent[1]["content"] == "Let me check."
            assert sent[1]["tool_calls"][0]["function"] == {
                "name": "check_slots", "arguments": '{"party_size": 4}'}
            assert sent[2] == {"role": "tool", "tool_call_id": "c1", "name": "check_slots",
                               "content": "19:00"}
            [event] = h.tool_events()
            assert event["tool"] == "check_slots" and event["outcome"] == "ok"
            assert 0 <= event["ms"] < 2_000
        finally:
            await h.session.close()

    run(main())


def test_parallel_calls_run_at_once_and_their_results_keep_the_calls_order() -> None:
    started: list[str] = []
    both = threading.Barrier(2, timeout=2)

    @tool
    def slow_a() -> str:
        """A."""
        started.append("a")
        both.wait()  # returns only once the other call runs too
        return "A"

    @tool
    def slow_b() -> str:
        """B."""
        started.append("b")
        both.wait()
        return "B"

    async def main() -> None:
        llm = ToolScriptLLM([[call("slow_a", "ca"), call("slow_b", "cb")]], ["Done."])
        h = Harness(llm, Tools([slow_a, slow_b]))
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("Both please."))
            await h.until(lambda: h.ends)
            sent = llm.requests[1]["messages"]
            assert [(m["tool_call_id"], m["content"]) for m in sent if m["role"] == "tool"] == [
                ("ca", "A"), ("cb", "B")]
            assert sorted(started) == ["a", "b"]
        finally:
            await h.session.close()

    run(main())


def test_errors_timeouts_and_bad_arguments_go_back_to_the_model_and_the_reply_goes_on() -> None:
    @tool
    def broken() -> str:
        """Fails."""
        raise RuntimeError("the booking system is down")

    @tool(timeout_s=0.1)
    async def hangs() -> str:
        """Never returns."""
        await asyncio.sleep(30)
        return "never"

    async def main() -> None:
        llm = ToolScriptLLM(
            [[call("broken", "c1"), call("hangs", "c2"), call("check_slots", "c3", party_size="x"),
              call("nope", "c4")]],
            ["Sorry, I cannot check right now."])
        h = Harness(llm, Tools([broken, hangs, check_slots]))
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("A table?"))
            await h.until(lambda: h.ends)
            results = {m["tool_call_id"]: m["content"] for m in llm.requests[1]["messages"]
                       if m["role"] == "tool"}
            assert "the booking system is down" in results["c1"]
            assert "timed out" in results["c2"]
            assert "party_size" in results["c3"]
            assert "nope" in results["c4"] and "check_slots" in results["c4"]
            assert " ".join(h.spoken) == "Sorry, I cannot check right now."  # the caller hears why
            outcomes = sorted(e["outcome"] for e in h.tool_events())
            assert outcomes == ["error", "invalid", "timeout", "unknown"]
        finally:
            await h.session.close()

    run(main())


def test_a_slow_tool_gets_the_filler_unless_the_agent_already_spoke() -> None:
    @tool
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(0.4)
        return "ready"

    async def main() -> None:
        for said_first, expect_filler in ((False, True), (True, False)):
            step: Step = (["Let me see."] if said_first else []) + [[call("slow")]]
            llm = ToolScriptLLM(step, ["It is ready."])
            h = Harness(llm, Tools([slow]), filler_delay_ms=100, filler="One moment.")
            await h.session.start()
            try:
                h.session.push(UserTurnEnded("Is it ready?"))
                await h.until(lambda h=h: h.ends)
                assert ("One moment." in h.spoken) is expect_filler
                assert h.spoken[-1] == "It is ready."
                assert h.stage.fillers == int(expect_filler)
                # the filler is the agent's, not the model's: not in the history
                assert all(e.content != "One moment." for e in h.stage.history.entries)
            finally:
                await h.session.close()

    run(main())


def test_a_barge_in_cancels_plain_tools_and_lets_side_effects_finish_into_the_history() -> None:
    finished: list[str] = []

    @tool
    async def lookup() -> str:
        """Looks something up."""
        await asyncio.sleep(1.0)
        finished.append("lookup")
        return "found"

    @tool(side_effects=True)
    async def reserve() -> str:
        """Makes a booking."""
        await asyncio.sleep(1.0)
        finished.append("reserve")
        return "reserved"

    async def main() -> None:
        llm = ToolScriptLLM([[call("lookup", "c1"), call("reserve", "c2")]], ["Anything else?"])
        h = Harness(llm, Tools([lookup, reserve]))
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("Book it."))
            await h.until(lambda: len(h.tool_events()) == 0 and h.stage.tool_calls == 2)
            await asyncio.sleep(0.1)
            h.session.push(Interrupt())
            await h.until(lambda: h.ends)
            assert h.ends[-1].cancelled
            h.session.push(UserTurnEnded("Hello?"))  # the next request waits for the booking
            await h.until(lambda: len(llm.requests) == 2)
            assert finished == ["reserve"]
            results = {m["tool_call_id"]: m["content"] for m in llm.requests[1]["messages"]
                       if m["role"] == "tool"}
            assert results == {"c1": CANCELLED, "c2": "reserved"}
            roles = [m["role"] for m in llm.requests[1]["messages"]]
            assert roles[-5:] == ["user", "assistant", "tool", "tool", "user"]
            assert {e["tool"]: e["outcome"] for e in h.tool_events()} == {
                "lookup": "cancelled", "reserve": "ok"}
        finally:
            await h.session.close()

    run(main())


def test_no_tool_runs_on_a_speculative_turn_and_a_discarded_one_never_runs_it() -> None:
    BOOKED.clear()

    async def main() -> None:
        steps = [[[call("book", name="Ana", party_size=2, time="18:00")]], ["Booked."]]
        llm = ToolScriptLLM(*steps)
        h = Harness(llm, Tools([book]), preempt=True)
        await h.session.start()
        try:
            h.session.push(TurnCandidate("Book for two at six"))
            await h.until(lambda: len(llm.requests) == 1)
            await asyncio.sleep(0.2)
            assert BOOKED == [] and h.stage.tool_calls == 0  # generated, not run
            h.session.push(SpeechStarted(at=0))  # the caller goes on: discarded
            await asyncio.sleep(0.2)
            assert BOOKED == [] and h.stage.tool_calls == 0
            # the confirmed turn: the same text, spoken again as a candidate then confirmed
            llm.steps = [list(s) for s in steps]
            h.session.push(TurnCandidate("Book for two at six please"))
            await h.until(lambda: len(llm.requests) == 2)
            await asyncio.sleep(0.1)
            assert BOOKED == []
            h.session.push(UserTurnEnded("Book for two at six please"))
            await h.until(lambda: h.ends)
            assert BOOKED == [("Ana", 2, "18:00")] and h.stage.adopted == 1
            assert h.spoken == ["Booked."]
        finally:
            await h.session.close()

    run(main())


def test_the_hang_up_tool_ends_the_call_after_the_goodbye() -> None:
    async def main() -> None:
        for said, expected in ((["Goodbye, Ana!"], ["Goodbye, Ana!"]), ([], ["Bye now."])):
            llm = ToolScriptLLM(said + [[call("hang_up")]])
            h = Harness(llm, builtin_tools(["hang_up"]), goodbye="Bye now.")
            await h.session.start()
            try:
                h.session.push(UserTurnEnded("That's all, thanks."))
                await h.until(lambda h=h: any(isinstance(f, HangUp) for f in h.out))
                assert h.spoken == expected
                hang = next(f for f in h.out if isinstance(f, HangUp))
                assert h.out.index(hang) > max(i for i, f in enumerate(h.out)
                                               if isinstance(f, TextToSpeak))
                assert len(llm.requests) == 1  # no request after the hang-up
                assert await asyncio.wait_for(h.session.wait_hangup(), 5) == "agent"
            finally:
                await h.session.close()

    run(main())


def test_tool_choice_forces_the_first_request_only_and_the_steps_are_bounded() -> None:
    async def main() -> None:
        loops = [[[call("check_slots", f"c{i}", party_size=2)]] for i in range(5)]
        llm = ToolScriptLLM(*loops[:3], ["Here you go."])
        stage_cfg = LLMConfig(tool_choice="check_slots", max_tool_steps=2)
        h = Harness(llm, Tools([check_slots]))
        h.stage.cfg = stage_cfg
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("Times?"))
            await h.until(lambda: h.ends)
            choices = [r["tool_choice"] for r in llm.requests]
            offered = [r["tools"] is not None for r in llm.requests]
            assert choices[0] == {"type": "function", "function": {"name": "check_slots"}}
            assert choices[1] is None and offered == [True, True, False]
            assert h.stage.tool_calls == 2
        finally:
            await h.session.close()

    run(main())


def test_a_tool_gets_the_call_through_its_context() -> None:
    seen: list[Any] = []

    @tool
    def who(ctx: ToolContext) -> str:
        """Which call this is."""
        seen.append((ctx.call_id, ctx.keypad))
        return ctx.call_id

    async def main() -> None:
        llm = ToolScriptLLM([[call("who")]], ["Fine."])
        h = Harness(llm, Tools([who]))
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("Who am I?"))
            await h.until(lambda: h.ends)
            assert seen == [(h.session.id, h.session.keypad)]
        finally:
            await h.session.close()

    run(main())


def test_a_backend_without_tools_is_refused_with_tools_configured() -> None:
    class Plain(ToolScriptLLM):
        capabilities = LLMCapabilities(tools=False)

    with pytest.raises(Exception, match="cannot call tools"):
        LLMStage(Plain(), LLMConfig(), AgentConfig(), tools=Tools([check_slots]))


def test_a_speak_tool_s_result_is_the_reply_and_no_second_request_is_made() -> None:
    @tool(speak=True, side_effects=True)
    def confirm(code: str) -> str:
        """Books and confirms."""
        return f"You are booked, your code is {code}."

    async def main() -> None:
        llm = ToolScriptLLM([[call("confirm", code="B-17")]])
        h = Harness(llm, Tools([confirm]))
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("Book it."))
            await h.until(lambda: h.ends)
            assert h.spoken == ["You are booked, your code is B-17."]
            assert len(llm.requests) == 1
            roles = [(e.role, e.content) for e in h.stage.history.entries]
            assert roles[-2:] == [("tool", "You are booked, your code is B-17."),
                                  ("assistant", "You are booked, your code is B-17.")]
            assert h.ends[-1].text == "You are booked, your code is B-17."
        finally:
            await h.session.close()

    run(main())


class Handover:
    """A CallControl that records when the transfer came, against the agent's playout."""

    transport = "test"

    def __init__(self, session: Session) -> None:
        self.session = session
        self.asked: list[tuple[str, bool]] = []

    async def transfer(self, target: str) -> str:
        self.asked.append((target, self.session.playout.idle))
        return f"transferred to {target}"

    async def send_dtmf(self, digits: str, duration_ms: int = 100, gap_ms: int = 80) -> None:
        raise AssertionError("not used")


def test_a_transfer_waits_for_the_agent_s_words_to_play_then_ends_the_call() -> None:
    async def main() -> None:
        llm = ToolScriptLLM(["I'll put you through now.",
                             [call("transfer_call", target="sip:host@example.com")]])
        h = Harness(llm, builtin_tools(["transfer_call"]))
        control = Handover(h.session)
        h.session.control = control
        # the agent's words become audio in the playout as they are said (a TTS's job)
        h.session.listen(lambda f: isinstance(f, TextToSpeak) and h.session.playout.write(
            np.ones(4800, np.int16), last=True), frozenset({TextToSpeak}))
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("A human please."))
            await h.until(lambda: h.spoken and h.stage.tool_calls == 1)
            await asyncio.sleep(0.1)
            assert control.asked == []  # not while the words are still queued
            while h.session.playout.pull() is not None:
                pass
            await h.until(lambda: any(isinstance(f, HangUp) for f in h.out))
            assert control.asked == [("sip:host@example.com", True)]
            assert next(f for f in h.out if isinstance(f, HangUp)).reason == "transferred"
            assert [e["outcome"] for e in h.tool_events()] == ["ok"]
        finally:
            await h.session.close()

    run(main())


def test_a_tool_with_side_effects_finishes_after_the_call_ends() -> None:
    done: list[str] = []

    @tool(side_effects=True)
    async def charge() -> str:
        """Takes a deposit."""
        await asyncio.sleep(1.0)
        done.append("charged")
        return "charged"

    async def main() -> None:
        llm = ToolScriptLLM([[call("charge")]], ["Done."])
        h = Harness(llm, Tools([charge]))
        await h.session.start()
        h.session.push(UserTurnEnded("Take the deposit."))
        await h.until(lambda: h.stage.tool_calls == 1)
        await h.session.close()  # the caller hangs up mid-tool
        assert done == []
        await asyncio.sleep(1.5)
        assert done == ["charged"]

    run(main())


@tool
def quick() -> str:
    """Quick."""
    return "done"


class AnnouncesSlowly(ToolScriptLLM):
    """Announces its call (CALLS_COMING), writes it for ``writing_s``, then answers "All done."
    to the request after the tool."""

    def __init__(self, writing_s: float) -> None:
        super().__init__()
        self.writing_s = writing_s

    async def stream(self, messages, tools=None, tool_choice=None):  # noqa: ANN001, ANN201
        from agent.tools import CALLS_COMING

        self.requests.append({"messages": messages, "tools": tools})
        if len(self.requests) > 1:
            yield "All done."
            return
        yield CALLS_COMING
        await asyncio.sleep(self.writing_s)  # the arguments being written
        yield [call("quick")]


def test_the_filler_covers_the_call_being_written_from_when_the_backend_knows_it_comes() -> None:
    """A backend that says calls are coming (CALLS_COMING) starts the filler's clock: a slow
    call to write plus a quick tool still gets the filler, on time."""
    async def main() -> None:
        llm = AnnouncesSlowly(1.0)
        h = Harness(llm, Tools([quick]), filler_delay_ms=150, filler="One moment.")
        spoken_at: list[float] = []
        loop = asyncio.get_running_loop()
        h.session.listen(lambda f: isinstance(f, TextToSpeak) and spoken_at.append(loop.time()),
                         frozenset({TextToSpeak}))
        await h.session.start()
        try:
            t0 = loop.time()
            h.session.push(UserTurnEnded("Do it."))
            await h.until(lambda: h.ends)
            assert h.spoken[0] == "One moment." and h.spoken[-1] == "All done."
            # from the announcement (0.15 s), not the tool's start (1.15 s): margin for a
            # loaded machine
            assert 0.1 < spoken_at[0] - t0 < 0.8
            assert h.stage.fillers == 1
        finally:
            await h.session.close()

    run(main())


def test_a_speculative_reply_s_calls_get_the_filler_once_adopted_and_only_then() -> None:
    """The calls of a speculative reply are announced while the turn is unconfirmed: no filler
    then; once the turn is confirmed, the filler comes on the announcement's clock."""
    async def main() -> None:
        llm = AnnouncesSlowly(0.9)
        h = Harness(llm, Tools([quick]), filler_delay_ms=500, filler="One moment.", preempt=True)
        loop = asyncio.get_running_loop()
        await h.session.start()
        try:
            h.session.push(TurnCandidate("Do it"))
            await asyncio.sleep(0.55)  # past the delay, but unconfirmed: silence
            assert h.spoken == []
            confirmed = loop.time()
            h.session.push(UserTurnEnded("Do it"))
            await h.until(lambda: h.spoken)
            # the delay ran out while speculating: at once, not 0.5 s after the confirmation
            assert h.spoken == ["One moment."] and loop.time() - confirmed < 0.35
            await h.until(lambda: h.ends)
            assert h.spoken == ["One moment.", "All done."] and h.stage.adopted == 1
        finally:
            await h.session.close()

    run(main())


def test_announced_calls_that_never_come_leave_no_stray_filler() -> None:
    """The filler never plays for calls that never came; the empty reply is apologized for
    (the caller is not left in silence), once."""
    from agent.tools import CALLS_COMING
    from stages.faults import APOLOGY

    async def main() -> None:
        llm = ToolScriptLLM([CALLS_COMING])  # (announced, then nothing: no text, no calls)
        h = Harness(llm, Tools([check_slots]), filler_delay_ms=100, filler="One moment.")
        await h.session.start()
        try:
            h.session.push(UserTurnEnded("Hm?"))
            await h.until(lambda: h.ends)
            await asyncio.sleep(0.3)
            assert h.spoken == [APOLOGY] and h.stage.fillers == 0
        finally:
            await h.session.close()

    run(main())


def test_the_reply_is_chunked_for_the_tts_as_the_agent_config_says() -> None:
    """[agent]'s chunk limits reach the stage: a two-word start, a second chunk that ends at
    its clause (max_second_chunk_words), then sentences — and again for each reply."""
    reply = "Sure thing, for a table of four, we have seven o'clock free. Anything else?"
    tokens = [w if i == 0 else " " + w for i, w in enumerate(reply.split())]

    async def spoken(**agent: Any) -> list[str]:
        h = Harness(ToolScriptLLM(tokens, tokens), Tools([check_slots]),
                    min_first_chunk_words=1, max_first_chunk_words=2, **agent)
        await h.session.start()
        try:
            for n in (1, 2):
                h.session.push(UserTurnEnded("A table for four?"))
                await h.until(lambda n=n: len(h.ends) == n)
            return h.spoken
        finally:
            await h.session.close()

    chunks = ["Sure thing,", "for a table of four,", "we have seven o'clock free.", "Anything else?"]
    assert asyncio.run(spoken(max_second_chunk_words=6)) == chunks * 2
    assert asyncio.run(spoken(max_second_chunk_words=0)) == [
        "Sure thing,", "for a table of four, we have seven o'clock free.", "Anything else?"] * 2
