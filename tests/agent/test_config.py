import argparse

import pytest

from agent.config import Config, add_config_flags, config_from_args, load_toml, to_toml
from agent.errors import ConfigError


def _parse(argv):
    p = argparse.ArgumentParser()
    add_config_flags(p)
    return config_from_args(p.parse_args(argv))


def test_flags_map_one_to_one_onto_fields():
    cfg = _parse(["--llm-backend", "openai", "--turn-silence-ms", "450", "--runtime-uvloop", "off",
                  "--trace-budgets", "voice_to_voice=700", "--vad-threshold", "0.6"])
    assert cfg.llm.backend == "openai" and cfg.turn.silence_ms == 450
    assert cfg.runtime.uvloop is False and cfg.vad.threshold == 0.6
    assert cfg.trace.budgets["voice_to_voice"] == 700.0
    assert cfg.trace.budgets["llm_first_token"] == Config().trace.budgets["llm_first_token"]


def test_toml_round_trip_and_flags_override_file(tmp_path):
    cfg = Config()
    cfg.tts.backend = "espeak"
    cfg.llm.system_prompt = 'Say "hi"\\n'
    cfg.trace.budgets["voice_to_voice"] = 650.0
    f = tmp_path / "c.toml"
    f.write_text(to_toml(cfg))
    back = load_toml(f)
    assert back == cfg
    over = _parse(["--config", str(f), "--tts-backend", "piper"])
    assert over.tts.backend == "piper" and over.trace.budgets["voice_to_voice"] == 650.0


@pytest.mark.parametrize(
    "text, msg",
    [("[nope]\nx = 1\n", "unknown section"), ("[llm]\nbogus = 1\n", "unknown key llm.bogus"),
     ("[turn]\nsilence_ms = \"long\"\n", "expected int"), ("[llm\n", "not valid TOML")],
)
def test_bad_config_files_give_clear_errors(tmp_path, text, msg):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_toml(f)


def test_bad_flag_values():
    with pytest.raises(ConfigError, match="expected int"):
        _parse(["--turn-silence-ms", "soon"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        _parse(["--trace-budgets", "oops"])


def test_unknown_budget_spans_are_errors_naming_the_known_spans(tmp_path):
    from agent.trace import SPAN_ORDER

    known = "known spans: " + ", ".join(SPAN_ORDER)
    f = tmp_path / "c.toml"
    f.write_text("[trace.budgets]\nvoice_to_voice = 700\nllm_ttft = 200\n")
    with pytest.raises(ConfigError, match="trace.budgets: unknown span 'llm_ttft'") as err:
        load_toml(f)
    assert known in str(err.value) and str(f) in str(err.value)
    with pytest.raises(ConfigError, match="trace.budgets: unknown span 'tts_first'") as err:
        _parse(["--trace-budgets", "asr_final=250", "--trace-budgets", "tts_first=100"])
    assert known in str(err.value) and "command line" in str(err.value)
    # every span the trace times may have a budget, from either place
    f.write_text("[trace.budgets]\n" + "".join(f"{n} = 1\n" for n in SPAN_ORDER))
    assert all(load_toml(f).trace.budgets[n] == 1.0 for n in SPAN_ORDER)
    assert _parse(["--trace-budgets", "llm_first_chunk=150"]).trace.budgets["llm_first_chunk"] == 150
