"""A browser voice call with the embedded offline models: open the printed URL, press Call, talk.

The same as ``voxline serve``, spelled out: load the models once, build a fresh pipeline per call,
and hand the server a session factory. Pass ``--host 0.0.0.0`` to take calls from other machines
(a token is then required and printed in the URL).

    python examples/browser_call.py [--host 127.0.0.1] [--port 8080]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from agent.config import Config  # noqa: E402
from agent.presets import build_pipeline, load_models  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.trace import Trace  # noqa: E402
from transports.server import VoiceServer  # noqa: E402


async def main(host: str, port: int) -> None:
    cfg = Config()
    cfg.agent.greeting = "Hi! I'm a voxline demo agent. What would you like to talk about?"
    print("loading models…", flush=True)
    models = load_models(cfg)

    def new_session() -> Session:
        return Session(build_pipeline(cfg, models), Trace(cfg.trace.budgets))

    server = VoiceServer(new_session, host=host, port=port)
    await server.start()
    print(f"open {server.url} and press Call; Ctrl-C stops", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="browser voice call with the embedded models")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    a = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(a.host, a.port))
