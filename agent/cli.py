"""The ``voxline`` command line. Each command lives in ``agent/commands/``; this module only
builds the parser, so ``voxline --help`` imports no model runtime."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from agent import __version__
from agent.errors import VoxlineError

# command modules, each with add_parser(subparsers) and main(args) -> int
COMMANDS = [
    "agent.commands.run",
    "agent.commands.trace",
    "agent.commands.config",
    "agent.commands.models",
    "agent.commands.serve",
    "agent.commands.telephony",
    "agent.commands.transcribe",
    "agent.commands.asr_serve",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voxline", description="Real-time voice agents with per-stage latency budgets."
    )
    parser.add_argument("--version", action="version", version=f"voxline {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.set_defaults(func=None)  # each command's parser sets its own
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command not built in this checkout
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.func is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except VoxlineError as exc:
        print(f"voxline: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
