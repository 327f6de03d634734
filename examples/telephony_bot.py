"""A restaurant's phone line: the embedded pipeline answering SIP calls (a trunk or a PBX) and
Twilio calls (Media Streams) from one process. The agent looks up free tables in a small local
table and books one (its confirmation read out exactly as the booking system gave it), takes
the party size from the keypad, hands the caller to a person on request, and hangs up at the
end of the call.

    TWILIO_AUTH_TOKEN=... python examples/telephony_bot.py --sip-port 5060 --twilio-port 8080 \
        --public-url https://YOUR-TUNNEL.example --human sip:frontdesk@pbx.example

The embedded SmolLM2 (135M) is a plumbing model: it will rarely pick the right tool on its own.
For a line that takes bookings, point the agent at a capable model with function calling:
    --llm-backend openai --llm-base-url http://127.0.0.1:8000/v1 --llm-model NAME
(vLLM with --enable-auto-tool-choice, llama.cpp's llama-server --jinja, or a hosted API).

Connecting a real Twilio number
    1. Expose the Twilio port over HTTPS (a reverse proxy or a tunnel such as ngrok or
       cloudflared); Twilio only connects to wss:// streams.
    2. In the Twilio console, set the number's "A call comes in" webhook to
       https://YOUR-TUNNEL.example/twilio/twiml with method HTTP GET.
    3. For transfers through Twilio's REST API pass --twilio-account-sid (or set
       $TWILIO_ACCOUNT_SID); without it the call is handed to its <Dial> once its stream ends.

Connecting a PBX (Asterisk, FreeSWITCH) or a SIP trunk
    voxline is a plain UDP SIP endpoint without registration or authentication: the PBX sends
    calls to it as to a peer trunk, with G.711 (ulaw/alaw) and RFC 4733 DTMF. Asterisk
    (pjsip.conf):
        [voxline]      type=endpoint, context=from-voxline, disallow=all, allow=ulaw,alaw,
                       dtmf_mode=rfc4733, aors=voxline, direct_media=no
        [voxline]      type=aor, contact=sip:voxline@BOT_HOST:5060
        extensions.conf: exten => 7000,1,Dial(PJSIP/voxline)
    The transfer is a blind REFER: the PBX must accept REFER from the bot's endpoint.
    Behind NAT, pass --media-address with the address the PBX can reach for RTP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Annotated

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.commands.telephony import CallPrinter, session_factory  # noqa: E402
from agent.config import Config, add_config_flags, config_from_args  # noqa: E402
from agent.control import CallControlError  # noqa: E402
from agent.presets import load_models  # noqa: E402
from agent.tools import ToolContext, Tools, builtin_tools, tool  # noqa: E402

SYSTEM_PROMPT = (
    "You answer the phone for Luigi's, a small restaurant open 6 pm to 10 pm. Keep every "
    "answer to one or two short sentences. To book, find out how many guests (ask_party_size "
    "lets them type it) and when, check free_tables, then call book_table with the caller's "
    "name. If the caller asks for a person, say you will put them through and call "
    "transfer_to_human. When the caller is done, say goodbye and call hang_up."
)
GREETING = "Hello, this is Luigi's. Would you like to book a table?"


class Tables:
    """Tonight's tables: seats per time slot, and the bookings made (one process's memory; a
    real line would call its booking system here)."""

    def __init__(self) -> None:
        self.free = {"18:00": [2, 4], "19:00": [2], "20:00": [4, 6], "21:00": [2, 2, 4]}
        self.bookings: list[tuple[str, str, int, int]] = []  # (code, time, party, seats)
        self._lock = threading.Lock()

    def times_for(self, party: int) -> list[str]:
        return [t for t, seats in self.free.items() if any(s >= party for s in seats)]

    def book(self, name: str, party: int, time: str) -> tuple[str, int] | None:
        with self._lock:
            seats = sorted(s for s in self.free.get(time, []) if s >= party)
            if not seats:
                return None
            self.free[time].remove(seats[0])
            code = f"L{100 + len(self.bookings)}"
            self.bookings.append((code, time, party, seats[0]))
            return code, seats[0]


def restaurant_tools(tables: Tables, human: str) -> Tools:
    """The line's tools, bound to its table book and the person calls are transferred to."""

    @tool
    def free_tables(party_size: Annotated[int, "how many guests"]) -> str:
        """The times tonight that still have a table for the party."""
        if party_size < 1:
            return "error: the party needs at least one guest"
        times = tables.times_for(party_size)
        return ("free at " + ", ".join(times)) if times else "no table that size tonight"

    @tool(side_effects=True, speak=True)
    def book_table(
        name: Annotated[str, "the name the table is booked under"],
        party_size: Annotated[int, "how many guests"],
        time: Annotated[str, "one of the free times, as free_tables gave it, e.g. 19:00"],
    ) -> str:
        """Book a table tonight. Its confirmation is read to the caller as it is."""
        booked = tables.book(name.strip() or "guest", party_size, time.strip())
        if booked is None:
            return (f"Sorry, there is no table for {party_size} at {time} any more. "
                    f"Free times: {', '.join(tables.times_for(party_size)) or 'none'}.")
        code, _ = booked
        return f"Booked: a table for {party_size} at {time}, under {name}. Your code is {code}."

    @tool(timeout_s=30.0)
    async def ask_party_size(ctx: ToolContext) -> str:
        """Ask the caller to type the number of guests on the keypad; returns what they typed."""
        if ctx.keypad is None:
            return "this call has no keypad: ask the caller to say the number"
        ctx.say("Please type the number of guests on your keypad, then press the hash key.")
        await ctx.wait_played()
        got = await ctx.keypad.gather(count=2, terminator="#", timeout_s=8.0)
        return f"{got.digits} guests" if got.digits else "the caller typed nothing"

    @tool(side_effects=True, timeout_s=60.0)
    async def transfer_to_human(ctx: ToolContext) -> str:
        """Put the caller through to a person at the restaurant."""
        if not human:
            return "nobody can take calls right now: offer to take a booking instead"
        try:
            return await ctx.transfer(human)
        except CallControlError as exc:
            return f"the transfer failed ({exc}): apologise and offer to help instead"

    return Tools([free_tables, book_table, ask_party_size, transfer_to_human,
                  *builtin_tools(["hang_up"])])


async def main(args: argparse.Namespace) -> None:
    from transports.sip.server import SipServer
    from transports.twilio.server import TwilioServer

    cfg = config_from_args(args)
    cfg.agent.greeting = cfg.agent.greeting or GREETING
    if cfg.llm.system_prompt == Config().llm.system_prompt:
        cfg.llm.system_prompt = SYSTEM_PROMPT
    cfg.llm.max_tokens = max(cfg.llm.max_tokens, 96)  # room for a tool call's arguments
    print("loading models ...", file=sys.stderr, flush=True)
    models = load_models(cfg)
    models.tools = restaurant_tools(Tables(), args.human)
    make = session_factory(cfg, models, CallPrinter(as_json=False))
    sip = SipServer(make, host=args.host, port=args.sip_port,
                    transfer_to=args.human if args.human.startswith(("sip:", "sips:")) else "")
    twilio = TwilioServer(make, host=args.host, port=args.twilio_port,
                          public_url=args.public_url, twilio_auth_token=args.twilio_auth_token,
                          twilio_account_sid=args.twilio_account_sid)
    sip_addr = await sip.start()
    tw_addr = await twilio.start()
    print(f"SIP on udp {sip_addr[0]}:{sip_addr[1]}; Twilio on ws://{tw_addr[0]}:{tw_addr[1]}"
          f"{twilio.media_path} (TwiML: GET {twilio.twiml_path})", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await sip.stop()
        await twilio.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--sip-port", type=int, default=5060)
    ap.add_argument("--twilio-port", type=int, default=8080)
    ap.add_argument("--public-url", default="", help="the https:// address Twilio reaches")
    ap.add_argument("--twilio-auth-token", default=os.environ.get("TWILIO_AUTH_TOKEN", ""),
                    help="the account's auth token, to check Twilio's signatures (required with "
                         "--public-url; better as $TWILIO_AUTH_TOKEN)")
    ap.add_argument("--twilio-account-sid", default=os.environ.get("TWILIO_ACCOUNT_SID", ""),
                    help="the account's SID: transfers go through Twilio's REST API")
    ap.add_argument("--human", default="",
                    help="where a caller asking for a person is transferred: a SIP URI for SIP "
                         "calls, a phone number or SIP URI for Twilio calls (default: nobody)")
    add_config_flags(ap)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(ap.parse_args()))
