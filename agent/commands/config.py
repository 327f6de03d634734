"""``voxline config``: print the effective configuration as TOML (defaults, file, flags)."""

from __future__ import annotations

import argparse

from agent.config import add_config_flags, config_from_args, to_toml


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="print the effective configuration as TOML")
    add_config_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print(to_toml(config_from_args(args)), end="")
    return 0
