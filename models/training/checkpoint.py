"""Training checkpoints in safetensors: model, EMA and optimizer tensors, the rest as JSON metadata.

Written atomically (a temporary file in the same folder, flushed to disk, then ``os.replace``),
so an interrupted save never leaves a half-written checkpoint; a save that fails (a full disk,
the file-size limit: a :class:`CheckpointError`, the old checkpoint kept) removes its temporary
file, and :func:`remove_temporaries` clears those of a killed process. Each tensor and the
metadata carry a checksum, verified on load, and every floating tensor must be finite: flipped
bytes, edited metadata, NaN weights, a missing entry or a checkpoint of another run are a
:class:`CheckpointError` that says which, never a silent fresh start or a raw
``KeyError``/``ValueError``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

FORMAT = "axial_rope-train-2"  # 2: checksums; 1 (no checksums) still loads
LEGACY_FORMATS = ("axial_rope-train-1",)
EXPORTED = "exported_from"  # the key of an export's extra JSON (the run folder it came from)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: missing, corrupt, or from another run."""


def tensor_checksum(t: torch.Tensor) -> str:
    """A digest of a tensor's dtype, shape and bytes (any dtype: bf16 included)."""
    h = hashlib.blake2b(f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=16)
    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _meta_checksum(meta: dict[str, str]) -> str:
    body = json.dumps({k: v for k, v in meta.items() if k != "meta_checksum"}, sort_keys=True)
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


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


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def remove_temporaries(folder: str | Path, name: str = "checkpoint.safetensors") -> list[Path]:
    """Remove the temporary files that killed saves left in ``folder``; returns them.

    Only call it while no other process saves into ``folder`` (the trainer holds the run's lock).
    """
    stale = sorted(Path(folder).glob(f".{name}.tmp*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def save(
    path: str | Path,
    *,
    model: dict[str, torch.Tensor],
    ema: dict[str, torch.Tensor],
    optimizer: dict,
    step: int,
    run: dict,
    extra: dict | None = None,
) -> Path:
    """Write a checkpoint atomically. ``model``/``ema`` are full state dicts, ``optimizer`` its state dict;
    ``extra``: JSON the caller wants back from :func:`load` (the trainer's log window, its change history)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(f"could not make the folder of {path} ({err})") from err
    optim_tensors, optim_meta = _flatten_optimizer(optimizer)
    tensors = {f"model.{k}": v for k, v in model.items()} | {f"ema.{k}": v for k, v in ema.items()} | optim_tensors
    # tied weights share storage, which safetensors refuses: store private contiguous copies
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    _verify(path, tensors, None)  # NaN weights never replace a checkpoint (load would refuse them anyway)
    meta = {
        "format": FORMAT,
        "step": str(step),
        "run": json.dumps(run),
        "optimizer": json.dumps(optim_meta),
        "extra": json.dumps(extra or {}),
        "checksums": json.dumps({k: tensor_checksum(v) for k, v in tensors.items()}),
    }
    meta["meta_checksum"] = _meta_checksum(meta)
    tmp = _temporary(path)
    try:
        save_file(tensors, tmp, metadata=meta)
        with open(tmp, "rb+") as f:  # on disk before the rename: a power cut leaves the old file, not an empty one
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, SafetensorError) as err:  # disk full, the file-size limit (EFBIG: Python ignores SIGXFSZ)
        raise CheckpointError(f"could not write {path} ({err}): the checkpoint there, if any, is unchanged") from err
    finally:  # an exception or Ctrl-C mid-save: no temporary file left behind
        tmp.unlink(missing_ok=True)
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
    if meta.get("format") not in (FORMAT, *LEGACY_FORMATS):
        raise CheckpointError(f"{path} is not an axial_rope training checkpoint (format {meta.get('format')!r})")
    if meta["format"] == FORMAT and meta.get("meta_checksum") != _meta_checksum(meta):
        raise CheckpointError(f"{path}: its metadata (step, run settings, optimizer) fails its checksum: corrupt")
    return path, meta


def _parse(path: Path, meta: dict) -> dict:
    """The metadata's JSON fields, or a CheckpointError naming what is missing or malformed."""
    try:
        out = {"step": int(meta["step"]), "run": json.loads(meta["run"])}
        out["optimizer"] = json.loads(meta["optimizer"]) if "optimizer" in meta else None
        out["extra"] = json.loads(meta.get("extra", "{}"))
        out["checksums"] = json.loads(meta["checksums"]) if "checksums" in meta else None
    except (KeyError, ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{path}: broken metadata ({type(err).__name__}: {err})") from err
    if out["step"] < 0 or not isinstance(out["run"], dict):
        raise CheckpointError(f"{path}: broken metadata (step {out['step']}, run {type(out['run']).__name__})")
    return out


def metadata(path: str | Path) -> dict:
    """``{"step", "run", "exported"}`` of a checkpoint (a file or its run folder), without reading its tensors;
    ``exported``: written by an export (weights for inference, no optimizer state), not by a training run."""
    path, meta = _open(path)
    parsed = _parse(path, meta)
    return {"step": parsed["step"], "run": parsed["run"], "exported": EXPORTED in parsed["extra"]}


def _verify(path: Path, tensors: dict[str, torch.Tensor], checksums: dict | None) -> None:
    if checksums is not None:
        if set(checksums) != set(tensors):
            missing = sorted(set(checksums) ^ set(tensors))[:5]
            raise CheckpointError(f"{path}: tensors and their checksums disagree on the names {missing}: corrupt")
        bad = [k for k, v in tensors.items() if tensor_checksum(v) != checksums[k]]
        if bad:
            raise CheckpointError(f"{path}: {len(bad)} tensors fail their checksum ({bad[:5]}): corrupt")
    broken = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:
        raise CheckpointError(f"{path}: non-finite values (NaN or inf) in {broken[:5]}: not a usable checkpoint")


def load(path: str | Path, *, run: dict | None = None, keys: tuple[str, ...] = ()) -> dict:
    """Read a checkpoint (a file, or the run folder holding ``checkpoint.safetensors``) and check it.

    Args:
        run: this run's settings; every key in ``keys`` must equal the checkpoint's.

    Returns:
        ``{"model", "ema", "optimizer", "step", "run", "extra"}`` (``run``: the settings it was trained with).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path, meta = _open(path)
    parsed = _parse(path, meta)
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint ({err})") from err
    _verify(path, tensors, parsed["checksums"])
    saved = parsed["run"]
    diff = {k: (saved.get(k), run.get(k)) for k in keys if saved.get(k) != run.get(k)} if run else {}
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"{path} belongs to another run ({detail})")
    if parsed["optimizer"] is None:
        raise CheckpointError(f"{path}: broken metadata (no optimizer entry)")
    try:
        optimizer = _unflatten_optimizer(tensors, parsed["optimizer"])
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path}: broken optimizer metadata ({type(err).__name__}: {err})") from err
    return {
        "model": {k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
        "ema": {k[4:]: v for k, v in tensors.items() if k.startswith("ema.")},
        "optimizer": optimizer,
        "step": parsed["step"],
        "run": saved,
        "extra": parsed["extra"],
    }
