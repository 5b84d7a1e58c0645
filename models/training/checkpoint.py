"""Training checkpoints in safetensors: model, EMA and optimizer tensors, the rest as JSON metadata.

Written atomically (a temporary file in the same folder, then ``os.replace``), so an
interrupted save never leaves a half-written checkpoint. Loading checks the format and
that the checkpoint belongs to the run being resumed; anything else is a clear error,
never a silent fresh start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

FORMAT = "axial_rope-train-1"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: missing, corrupt, or from another run."""


# optimizer state is keyed by parameter index (plain) or by parameter name (FSDP2's full
# state dict), and names hold dots: "|" separates the parts of a flattened key
def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim|{index}|{key}"] = value
            else:
                scalars[f"{index}|{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    entries = [(n.removeprefix("optim|"), v) for n, v in tensors.items() if n.startswith("optim|")]
    state: dict[int | str, dict] = {}
    for name, value in entries + list(meta["scalars"].items()):
        index, key = name.split("|")
        state.setdefault(int(index) if index.isdigit() else index, {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save(
    path: str | Path,
    *,
    model: dict[str, torch.Tensor],
    ema: dict[str, torch.Tensor],
    optimizer: dict,
    step: int,
    run: dict,
) -> Path:
    """Write a checkpoint atomically. ``model``/``ema`` are full state dicts, ``optimizer`` its state dict."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    optim_tensors, optim_meta = _flatten_optimizer(optimizer)
    tensors = {f"model.{k}": v for k, v in model.items()} | {f"ema.{k}": v for k, v in ema.items()} | optim_tensors
    # tied weights share storage, which safetensors refuses: store private contiguous copies
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    meta = {"format": FORMAT, "step": str(step), "run": json.dumps(run), "optimizer": json.dumps(optim_meta)}
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, path)
    return path


def _open(path: str | Path) -> tuple[Path, dict]:
    """The checkpoint file of ``path`` (a file, or the run folder holding ``checkpoint.safetensors``) and its metadata."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.safetensors"
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint ({err})") from err
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an axial_rope training checkpoint (format {meta.get('format')!r})")
    return path, meta


def metadata(path: str | Path) -> dict:
    """``{"step", "run"}`` of a checkpoint (a file or its run folder), without reading its tensors."""
    _, meta = _open(path)
    return {"step": int(meta["step"]), "run": json.loads(meta["run"])}


def load(path: str | Path, *, run: dict | None = None, keys: tuple[str, ...] = ()) -> dict:
    """Read a checkpoint (a file, or the run folder holding ``checkpoint.safetensors``) and check it.

    Args:
        run: this run's settings; every key in ``keys`` must equal the checkpoint's.

    Returns:
        ``{"model", "ema", "optimizer", "step", "run"}`` (``run``: the settings it was trained with).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path, meta = _open(path)
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint ({err})") from err
    saved = json.loads(meta["run"])
    diff = {k: (saved.get(k), run.get(k)) for k in keys if saved.get(k) != run.get(k)} if run else {}
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"{path} belongs to another run ({detail})")
    return {
        "model": {k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
        "ema": {k[4:]: v for k, v in tensors.items() if k.startswith("ema.")},
        "optimizer": _unflatten_optimizer(tensors, json.loads(meta["optimizer"])),
        "step": int(meta["step"]),
        "run": saved,
    }
