"""``voxline asr-serve``'s flags: one flag per setting, with the default it really has."""

import argparse

from agent.cli import build_parser
from agent.config import ASRConfig, config_from_args


def _asr_serve() -> argparse.ArgumentParser:
    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["asr-serve"]


def test_each_engine_setting_has_one_flag():
    p = _asr_serve()
    flags = set(p._option_string_actions)
    # every [asr] field is set by --asr-FIELD alone: no bare --FIELD beside it
    asr = [a for a in p._actions if a.dest.startswith("cfg__asr__")]
    assert asr
    for action in asr:
        field = action.dest.removeprefix("cfg__asr__").replace("_", "-")
        assert f"--{field}" not in flags, f"--{field} duplicates --asr-{field}"
    cfg = config_from_args(p.parse_args(["--asr-slots", "2", "--asr-window-ms", "5"]))
    assert cfg.asr.slots == 2 and cfg.asr.window_ms == 5.0


def test_help_shows_the_real_slot_default():
    help_text = " ".join(_asr_serve().format_help().split())
    assert f"--asr-slots N asr.slots (default: {ASRConfig().slots})" in help_text
    assert "default 64" not in help_text and "--slots" not in help_text.replace("--asr-slots", "")
