"""NeMo state-dict keys → :class:`ParakeetTDT` parameters, with shape validation.

The encoder keys are NeMo's own; the prediction network and joint are renamed, and keys that only
training uses (losses, SpecAugment, the hybrid model's CTC head) are dropped. Every mismatch is
reported at once, with the key, so a wrong config or a truncated checkpoint is obvious.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from stages.asr.parakeet.dims import CheckpointError, ParakeetDims
from stages.asr.parakeet.model import ParakeetTDT

_IGNORED_PREFIXES = (
    "loss.",
    "spec_augmentation.",
    "joint._loss.",
    "joint._wer.",
    "ctc_decoder.",  # the 110m hybrid's CTC head: the TDT path never uses it
    "encoder.pos_enc.",  # positional tables are recomputed, never stored weights
    "wer.",
)
_RENAMES = (
    (re.compile(r"^preprocessor\.featurizer\."), "features."),
    (re.compile(r"^decoder\.prediction\.embed\."), "decoder.embed."),
    (re.compile(r"^decoder\.prediction\.dec_rnn\.lstm\."), "decoder.lstm."),
    (re.compile(r"^joint\.joint_net\.[12]\."), "joint.out."),
)


def nemo_to_voxline_key(key: str) -> str | None:
    """The parameter name a NeMo key loads into, or None for keys inference ignores."""
    if key.startswith(_IGNORED_PREFIXES):
        return None
    for pattern, repl in _RENAMES:
        key, n = pattern.subn(repl, key)
        if n:
            break
    return key


def voxline_to_nemo_state(model: ParakeetTDT) -> dict[str, torch.Tensor]:
    """The model's weights under NeMo key names (what ``write_nemo`` stores)."""
    out_index = 2 if model.dims.decoder.joint_dropout_slot else 1
    back = (
        ("features.", "preprocessor.featurizer."),
        ("decoder.embed.", "decoder.prediction.embed."),
        ("decoder.lstm.", "decoder.prediction.dec_rnn.lstm."),
        ("joint.out.", f"joint.joint_net.{out_index}."),
    )
    state = {}
    for key, value in model.state_dict().items():
        for ours, theirs in back:
            if key.startswith(ours):
                key = theirs + key[len(ours) :]
                break
        state[key] = value
    return state


def build_model(dims: ParakeetDims, state: Mapping[str, torch.Tensor]) -> ParakeetTDT:
    """A float32 CPU model holding ``state``'s weights; every key and shape is checked first."""
    with torch.device("meta"):
        skeleton = ParakeetTDT(dims)
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}

    mapped: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    for key, value in state.items():
        ours = nemo_to_voxline_key(key)
        if ours is None:
            continue
        if not isinstance(value, torch.Tensor):
            problems.append(f"{key}: not a tensor")
            continue
        if ours not in expected:
            problems.append(f"unexpected key {key} (not part of the model the config describes)")
            continue
        if tuple(value.shape) != expected[ours]:
            problems.append(
                f"{key}: shape {tuple(value.shape)}, the config implies {expected[ours]}"
            )
            continue
        mapped[ours] = value.float() if value.is_floating_point() else value
    optional = ("features.window", "features.fb")  # recomputed when a checkpoint lacks them
    for key in expected:
        if key not in mapped and key not in optional and not key.endswith("num_batches_tracked"):
            problems.append(f"missing key {_nemo_name(key, dims)}")
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise CheckpointError(
            f"the checkpoint's weights do not match its config ({len(problems)} problems):\n  {shown}{more}"
        )

    model = _empty_model(dims)
    model.load_state_dict(mapped, strict=False, assign=True)
    leftover = [name for name, t in model.state_dict().items() if t.is_meta]
    if leftover:
        raise CheckpointError(f"weights left unset after loading: {', '.join(leftover[:5])}")
    model.features.to(torch.float32)
    return model.eval()


def _nemo_name(key: str, dims: ParakeetDims) -> str:
    model_key = {
        "features.": "preprocessor.featurizer.",
        "decoder.embed.": "decoder.prediction.embed.",
        "decoder.lstm.": "decoder.prediction.dec_rnn.lstm.",
        "joint.out.": f"joint.joint_net.{2 if dims.decoder.joint_dropout_slot else 1}.",
    }
    for ours, theirs in model_key.items():
        if key.startswith(ours):
            return theirs + key[len(ours) :]
    return key


def _empty_model(dims: ParakeetDims) -> ParakeetTDT:
    """A model whose big tensors are left unallocated until the checkpoint's are assigned:
    initialising 600 M random parameters only to overwrite them costs seconds."""
    with torch.device("meta"):
        model = ParakeetTDT(dims)
    model.features = type(model.features)(dims.front_end)  # real buffers, maybe overwritten below
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))
    return model
