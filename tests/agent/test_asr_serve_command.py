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


def test_the_listener_flags_and_their_defaults():
    p = _asr_serve()
    args = p.parse_args([])
    assert args.socket is None  # the private per-user default, worked out at start
    assert (args.max_audio_seconds, args.max_uploads, args.max_upload_mb) == (3600.0, 4, 25.0)
    assert (args.http_header_timeout, args.http_upload_timeout) == (10.0, 60.0)
    assert args.allow_host == [] and args.socket_group is None
    assert args.max_streams_per_connection == 0
    help_text = " ".join(p.format_help().split())
    assert "/tmp/voxline-asr.sock" not in help_text
    assert "$XDG_RUNTIME_DIR/voxline/asr.sock" in help_text
    args = p.parse_args(["--token", "t0k", "--allow-host", "asr.lan", "--allow-host", "x",
                         "--socket-group", "audio", "--max-audio-seconds", "600"])
    assert args.token == "t0k" and args.allow_host == ["asr.lan", "x"]
    assert args.socket_group == "audio" and args.max_audio_seconds == 600.0


def test_http_host_port_is_checked():
    import pytest

    from agent.commands.asr_serve import parse_host_port
    from agent.errors import ConfigError

    assert parse_host_port("127.0.0.1:8300") == ("127.0.0.1", 8300)
    assert parse_host_port("[::1]:0") == ("::1", 0)
    assert parse_host_port(":8300") == ("127.0.0.1", 8300)
    for bad in ("8300", "host:", "h:70000", "h:²"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            parse_host_port(bad)


def test_the_server_runs_one_whisper_call_per_thread_unless_told():
    p = _asr_serve()
    # calls default to one Whisper call with every thread; the server (and files) to one per
    # thread
    cfg = config_from_args(p.parse_args(["--asr-threads", "3"]))
    assert cfg.asr.workers == 0 and cfg.asr.for_throughput().workers == 3
    told = config_from_args(p.parse_args(["--asr-threads", "4", "--asr-workers", "1"]))
    assert told.asr.for_throughput().workers == 1  # set explicitly: kept
    remote = config_from_args(p.parse_args(["--asr-backend", "remote"]))
    assert remote.asr.for_throughput().workers == 0  # the remote backend's own default
