"""A telephone voice bot: the embedded pipeline answering SIP calls (a trunk or a PBX) and Twilio
calls (Media Streams) from one process, greeting each caller and reading back keypad digits.

    TWILIO_AUTH_TOKEN=... python examples/telephony_bot.py --sip-port 5060 --twilio-port 8080 \
        --public-url https://YOUR-TUNNEL.example

Connecting a real Twilio number
    1. Expose the Twilio port over HTTPS (a reverse proxy or a tunnel such as ngrok or
       cloudflared); Twilio only connects to wss:// streams.
    2. In the Twilio console, set the number's "A call comes in" webhook to
       https://YOUR-TUNNEL.example/twilio/twiml with method HTTP GET. It answers
       <Response><Connect><Stream url="wss://YOUR-TUNNEL.example/twilio/media"/></Connect>
       </Response>, a bidirectional stream: caller audio in, agent audio, marks and clear out.

Connecting a PBX (Asterisk, FreeSWITCH) or a SIP trunk
    voxline is a plain UDP SIP endpoint without registration or authentication: the PBX sends
    calls to it as to a peer trunk, with G.711 (ulaw/alaw) and RFC 4733 DTMF. Asterisk
    (pjsip.conf):
        [voxline]      type=endpoint, context=from-voxline, disallow=all, allow=ulaw,alaw,
                       dtmf_mode=rfc4733, aors=voxline, direct_media=no
        [voxline]      type=aor, contact=sip:voxline@BOT_HOST:5060
        extensions.conf: exten => 7000,1,Dial(PJSIP/voxline)
    FreeSWITCH: a gateway with register=false and proxy BOT_HOST:5060, or
        <action application="bridge" data="sofia/external/bot@BOT_HOST:5060"/>.
    Behind NAT, pass --media-address with the address the PBX can reach for RTP.
    Not there yet: REGISTER (voxline cannot register to a trunk), digest auth, TLS, SRTP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.commands.telephony import CallPrinter, session_factory  # noqa: E402
from agent.config import Config  # noqa: E402
from agent.frames import Dtmf, TextToSpeak  # noqa: E402
from agent.presets import load_models  # noqa: E402
from agent.session import Session  # noqa: E402


def read_back_keys(session: Session) -> None:
    """Speak every key the caller presses (DTMF arrives as a frame from either transport)."""
    loop = asyncio.get_running_loop()

    def on_frame(frame: Any) -> None:
        if isinstance(frame, Dtmf):
            loop.call_soon(session.push, TextToSpeak(f"You pressed {frame.digit}."))

    session.listen(on_frame, frozenset({Dtmf}))


async def main(args: argparse.Namespace) -> None:
    from transports.sip.server import SipServer
    from transports.twilio.server import TwilioServer

    cfg = Config()
    cfg.agent.greeting = "Hello, you are talking to a voxline bot. How can I help?"
    print("loading models ...", file=sys.stderr, flush=True)
    models = load_models(cfg)
    make = session_factory(cfg, models, CallPrinter(as_json=False))
    sip = SipServer(make, host=args.host, port=args.sip_port,
                    on_call=lambda call: read_back_keys(call.session))
    twilio = TwilioServer(make, host=args.host, port=args.twilio_port,
                          public_url=args.public_url, twilio_auth_token=args.twilio_auth_token,
                          on_call=lambda call: read_back_keys(call.session))
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
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(ap.parse_args()))
