"""What a caller hears and a client sees when the LLM or the TTS fails: the apology, and a
stable fault code with a generic message (the detail goes only to the server log)."""

from __future__ import annotations

from agent.errors import VoxlineError
from agent.frames import ErrorFrame

APOLOGY = "Sorry, I'm having trouble — one moment."
"""Spoken when a reply fails; both voices read the dash as a pause (Piper phonemizes it as
``;``, eSpeak NG pauses as for ``;``), never as a word."""

LLM_UNAVAILABLE = "llm_unavailable"
LLM_TIMEOUT = "llm_timeout"
LLM_BAD_RESPONSE = "llm_bad_response"
LLM_EMPTY_REPLY = "llm_empty_reply"
TTS_FAILED = "tts_failed"

MESSAGES: dict[str, str] = {
    LLM_UNAVAILABLE: "the assistant's language model is unavailable",
    LLM_TIMEOUT: "the assistant's language model did not answer in time",
    LLM_BAD_RESPONSE: "the assistant's language model sent a reply that could not be read",
    LLM_EMPTY_REPLY: "the assistant's language model gave a reply with nothing to say",
    TTS_FAILED: "the assistant's voice could not speak a reply",
}


class StageFault(VoxlineError):
    """A failure a stage reports to clients by its ``code`` alone: ``str(fault)`` — the
    upstream detail, which may name internal addresses — is for the server log only."""

    code: str = LLM_UNAVAILABLE


def fault_frame(code: str, stage: str) -> ErrorFrame:
    """The error event for fault ``code``: the code, then its generic message
    (``"llm_timeout: the assistant's language model did not answer in time"``), so a client
    can tell the faults apart by the message's first word."""
    return ErrorFrame(f"{code}: {MESSAGES.get(code, 'the assistant had a problem')}",
                      stage=stage, code=code)
