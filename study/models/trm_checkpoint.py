"""Checkpoints written by TinyRecursiveModels' (or HRM's) pretrain.py, read into loopstudy's reasoner.

Such a file is a `torch.save`d state dict of the loss head around the model (keys `model.inner.<name>`, under
torch.compile `_orig_mod.model.inner.<name>`), with the run's `all_config.yaml` beside it; `arch.name` says TRM or
HRM (shared/spec/reference_models.md). It is read with `torch.load(weights_only=True)`: tensors only, never code.

`published_keys` gives the loopstudy model keys that express the checkpoint's architecture exactly (from its config
and its tensors' shapes); `to_state_dict` maps every tensor onto a reasoner built with them. Each refusal is one
CheckpointError line naming the file and what is wrong.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from study.config.init_from import TRM_CONFIG
from study.errors import ConfigError

ARCHS = {"TinyRecursiveReasoningModel_ACTV1": "trm", "HierarchicalReasoningModel_ACTV1": "hrm"}
PREFIXES = ("_orig_mod.", "model.inner.")  # torch.compile's, then the loss head's and the ACT wrapper's


class CheckpointError(ConfigError):
    """A checkpoint that cannot be read as a TRM or HRM model."""


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by their model names (prefixes dropped), loaded without running any code."""
    import pickle

    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        said = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if said:  # weights_only refused a global: unpickling the file would call it
            raise CheckpointError(f"checkpoint {path} is refused: loading it would run code ({said[1]}), not only "
                                  "read tensors") from None
        raise CheckpointError(f"checkpoint {path} is not a torch state dict (no pickle of tensors)") from None
    except Exception as e:  # not a torch file at all
        raise CheckpointError(f"checkpoint {path} is not a torch state dict ({type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0][:160]})") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = training_state_weights(data)
    if not isinstance(data, dict) or not data or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise CheckpointError(f"checkpoint {path} is not a state dict (a mapping of names to tensors)")
    out = {}
    for key, value in data.items():
        name = str(key)
        for prefix in PREFIXES:
            name = name.removeprefix(prefix)
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = "NaN" if bool(value.isnan().any()) else "infinite"
            raise CheckpointError(f"checkpoint {path}: tensor {key} holds {bad} values; a model read from it "
                                  "would predict nothing meaningful")
        out[name] = value.float()
    return out


def training_state_weights(data: dict) -> dict:
    """The weights of pretrain.py's newer checkpoint format ({"model", "optimizers", "step", "ema_helper"}): the
    model's, with the EMA's parameters over them where it kept them (the weights TRM's own evaluation reads; its
    buffers, the initial states and the puzzle embedding, are the model's)."""
    weights = dict(data["model"])
    shadow = data.get("ema_helper")
    if isinstance(shadow, dict):
        weights.update({k: v for k, v in shadow.items() if k in weights and isinstance(v, torch.Tensor)})
    return weights


def read_arch(path: Path) -> tuple[str, dict[str, Any]]:
    """('trm' or 'hrm', the `arch` section) from the all_config.yaml beside the checkpoint."""
    import yaml

    config = path.parent / TRM_CONFIG
    if not config.is_file():
        raise CheckpointError(f"checkpoint {path}: no {TRM_CONFIG} beside it (pretrain.py writes the run's config "
                              "there; it says which architecture the tensors are)")
    try:
        arch = (yaml.safe_load(config.read_text()) or {}).get("arch") or {}
    except (yaml.YAMLError, AttributeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config}: not a YAML mapping ({type(e).__name__})") from None
    name = str(arch.get("name", ""))
    kind = ARCHS.get(name.rsplit("@", 1)[-1])
    if kind is None:
        raise CheckpointError(f"{config}: arch.name {name!r} is not one loopstudy reads; known: "
                              + ", ".join(f"...@{a}" for a in ARCHS))
    return kind, arch


def published_keys(kind: str, arch: dict[str, Any], tensors: dict[str, torch.Tensor], source: str) -> dict[str, Any]:
    """The loopstudy model keys of this checkpoint, from its config and its tensors' shapes."""
    emb = tensors.get("embed_tokens.embedding_weight")
    if emb is None:
        raise CheckpointError(f"{source}: no tensor embed_tokens.embedding_weight: not a TRM or HRM checkpoint")
    hidden = int(emb.shape[1])
    heads = int(arch.get("num_heads", 0) or 0)
    if heads <= 0 or hidden % heads:
        raise CheckpointError(f"{source}: arch.num_heads {arch.get('num_heads')!r} does not divide hidden {hidden}")
    ndim = int(arch.get("puzzle_emb_ndim", 0) or 0)
    prefix = int(arch.get("puzzle_emb_len", 0) or 0) if kind == "trm" else 0
    prefix = prefix or math.ceil(ndim / hidden)
    pos = {"rope": "rope", "learned": "learned"}.get(str(arch.get("pos_encodings", "rope")), "none")
    keys = {"kind": "nested", "hidden": hidden, "heads": heads, "n_layers": int(arch["L_layers"]),
            "expansion": float(arch.get("expansion", 4.0)), "norm": "post", "conv": False, "pos": pos,
            "H": int(arch["H_cycles"]), "L": int(arch["L_cycles"]), "grad_steps": 1, "recall": True,
            "swiglu_multiple": 256, "init": "trunc_lecun", "init_states": "fixed", "head_norm": False,
            "puzzle_prefix": prefix, "q_head": True,
            "mixer": "mlp" if kind == "trm" and arch.get("mlp_t") else "attention"}
    if kind == "hrm":
        keys["h_layers"] = int(arch["H_layers"])
    if ndim not in (0, hidden):
        raise CheckpointError(f"{source}: puzzle_emb_ndim {ndim} is not the hidden size {hidden}; loopstudy reads "
                              "puzzle embeddings of one row of hidden values")
    return keys


def halting_defaults(kind: str, arch: dict[str, Any]) -> dict[str, Any]:
    """How the checkpoint's own ACT halts (model.halting's q_head settings, which a spec may change): TRM on
    q_halt > 0 (`no_ACT_continue`, its default), HRM on q_halt > q_continue; at most `halt_max_steps` updates."""
    plain = kind == "trm" and bool(arch.get("no_ACT_continue", True))
    steps = arch.get("halt_max_steps")
    return {"halting.q_compare": "zero" if plain else "continue",
            "halting.max_updates": int(steps) if isinstance(steps, int) and steps >= 1 else None}


def shape_facts(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """What the tensors say of the task: vocab, puzzle identifiers, and (TRM-MLP) the positions mixed."""
    facts = {"vocab": int(tensors["embed_tokens.embedding_weight"].shape[0]),
             "puzzles": int(tensors["puzzle_emb.weights"].shape[0]) if "puzzle_emb.weights" in tensors else 0}
    mlp_t = next((t for k, t in tensors.items() if k.endswith("mlp_t.gate_up_proj.weight")), None)
    if mlp_t is not None:
        facts["positions"] = int(mlp_t.shape[1])
    return facts


# TRM / HRM tensor name -> loopstudy's, per layer i of a level; `block` is the level's loopstudy block
LAYER_NAMES = {"self_attn.qkv_proj.weight": "sublayers.{a}.attn.qkv.weight",
               "self_attn.o_proj.weight": "sublayers.{a}.attn.proj.weight",
               "mlp_t.gate_up_proj.weight": "sublayers.{a}.token_mlp.mlp.gate_up.weight",
               "mlp_t.down_proj.weight": "sublayers.{a}.token_mlp.mlp.down.weight",
               "mlp.gate_up_proj.weight": "sublayers.{m}.gate_up.weight",
               "mlp.down_proj.weight": "sublayers.{m}.down.weight"}
TOP_NAMES = {"embed_tokens.embedding_weight": "tok.weight", "lm_head.weight": "head.weight",
             "q_head.weight": "q_head.weight", "q_head.bias": "q_head.bias", "puzzle_emb.weights": "puzzle.weight",
             "H_init": "y_init", "L_init": "z_init"}
LAYER = re.compile(r"^(?P<level>[HL])_level\.layers\.(?P<i>\d+)\.(?P<rest>.+)$")


def loopstudy_name(name: str, kind: str) -> str | None:
    """loopstudy's name of a TRM / HRM tensor (None: not one loopstudy knows). TRM runs its L_level for both
    updates (loopstudy's `block`); HRM's H_level is the outer update's own block (`h_block`)."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    m = LAYER.match(name)
    if m is None or m["rest"] not in LAYER_NAMES:
        return None
    block = "h_block" if m["level"] == "H" else "block"
    if m["level"] == "H" and kind != "hrm":
        return None
    i = int(m["i"])
    return f"{block}." + LAYER_NAMES[m["rest"]].format(a=2 * i, m=2 * i + 1)


def to_state_dict(tensors: dict[str, torch.Tensor], kind: str, model: torch.nn.Module,
                  source: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the model's names, every one of them checked: a tensor loopstudy does not
    know, one the model lacks, and a shape that differs are each refused, naming the tensor."""
    own = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        mine = loopstudy_name(name, kind)
        if mine is None or mine not in own:
            raise CheckpointError(f"{source}: tensor {name} has no place in the model the spec describes (an extra "
                                  "tensor, or model keys that contradict the checkpoint)")
        if tuple(own[mine].shape) != tuple(value.shape):
            raise CheckpointError(f"{source}: tensor {name} has shape {tuple(value.shape)}, the model wants "
                                  f"{tuple(own[mine].shape)} (model keys or task shape disagree with the checkpoint)")
        out[mine] = value
    missing = sorted(k for k in own if k not in out and not k.startswith(("carry_",)))
    if missing:
        raise CheckpointError(f"{source}: tensors missing for {', '.join(missing[:4])}"
                              + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
    return out
