"""Saving and restoring a :class:`~models.training.trainer.Run`: which checkpoint format, and how it fits.

FSDP2 runs save with DCP (models/training/sharded_checkpoint.py: each rank its shards); the others
save one ``checkpoint.safetensors`` (models/training/checkpoint.py: the whole state, rank 0 writes).
A save of one format removes the other's checkpoint once it is in place, so a folder holds one, and
a resume reads whichever it holds on any world size: DCP reshards itself; a safetensors checkpoint's
whole tensors are cut to this rank's shards, and its optimizer state (keyed by parameter index in
one process) is keyed by parameter name for FSDP2's ``set_optimizer_state_dict``.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch

from . import checkpoint, sharded_checkpoint
from .config import HYPERPARAMETERS, RUN_KEYS
from .distributed import on_rank0

__all__ = ["export_refusal", "restore", "save", "saved_step", "state"]

SAFETENSORS = "checkpoint.safetensors"


def _sharded(run) -> bool:
    return run.mesh is not None and run.cfg.fsdp


def _full(tensors) -> list[torch.Tensor]:
    # FSDP2 holds DTensor shards: gather (a collective, so every rank calls it)
    return [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]


def state(run) -> dict:
    """The whole state of ``run`` (gathered: a collective under FSDP2): ``{"model", "ema", "optimizer"}``."""
    model_state = run.model.state_dict()  # every name, tied aliases (GPT's output head) and buffers included
    model = dict(zip(model_state, _full(model_state.values())))
    index = {id(p): i for i, p in enumerate(run.model.parameters())}
    ema_full = _full(run.ema)
    ema = {name: ema_full[index[id(p)]] for name, p in run.model.named_parameters(remove_duplicate=False)}
    return {"model": model, "ema": ema, "optimizer": run.optimizer.state_dict()}


def save(run) -> None:
    """Write the checkpoint of ``run``'s step (collective; never called inside a step)."""
    extra = {"window": run.window, "history": run.history}
    if _sharded(run):
        kw = {"model": run.model, "optimizer": run.optimizer, "ema": run.ema}
        sharded_checkpoint.save(run.out, **kw, step=run.step, run=asdict(run.cfg), extra=extra)
        if run.rank == 0:
            (run.out / SAFETENSORS).unlink(missing_ok=True)  # superseded
        return
    whole = state(run)

    def write() -> None:  # rank 0 writes; a failed write (disk full) stops every rank, the old checkpoint kept
        checkpoint.save(run.out / SAFETENSORS, step=run.step, run=asdict(run.cfg), extra=extra, **whole)
        sharded_checkpoint.remove(run.out)  # superseded

    on_rank0(write)


def saved_step(out) -> int:
    """The step of the checkpoint ``out`` holds (a :class:`~models.training.checkpoint.CheckpointError` if none)."""
    if sharded_checkpoint.exists(out):
        return sharded_checkpoint.metadata(out)["step"]
    return checkpoint.metadata(out)["step"]


def export_refusal(out, path) -> str | None:
    """Why an export of the run in ``out`` may not be written to ``path`` (``None``: it may), as the end of a
    sentence that starts with the path. An export replaces an earlier export, nothing else of value: never the
    run's own checkpoint (either format: what ``--resume`` reads), another file of the run folder (its log, its
    settings), nor a training checkpoint anywhere (its optimizer state would be lost)."""
    path = Path(path)
    here = Path(os.path.realpath(path.parent)) / path.name  # a link at path is replaced, not followed
    in_run, never = here.parent == Path(os.path.realpath(out)), "an export never replaces"
    if (in_run and here.name == SAFETENSORS) or sharded_checkpoint.is_state_path(out, path):
        return f"is the run's own checkpoint in {out}: {never} what --resume reads; choose another file"
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        exported = checkpoint.metadata(path)["exported"]
    except checkpoint.CheckpointError:  # not a checkpoint (or an unreadable one)
        exported = None
    if exported is False:
        return f"holds a training checkpoint (with its optimizer state): {never} one; choose another file"
    if exported is None and in_run:
        return f"is a file of the run in {out}: {never} one; choose another file"
    return None


def restore(run) -> None:
    """Load the checkpoint of ``run.out`` into ``run``, resharded to this world; refuse another run's."""
    if sharded_checkpoint.exists(run.out):
        kw = {"model": run.model, "optimizer": run.optimizer, "ema": run.ema}
        saved = sharded_checkpoint.load(run.out, **kw, run=asdict(run.cfg), keys=RUN_KEYS)
        changed = _changes(run, saved["run"])
        check_optimizer(run.optimizer.state_dict(), saved["step"])
    else:
        saved = checkpoint.load(run.out / SAFETENSORS, run=asdict(run.cfg), keys=RUN_KEYS)
        changed = _changes(run, saved["run"])
        _load_whole(run, saved)
    run.step = run.saved_step = saved["step"]
    run.window = list(saved["extra"].get("window", []))
    run.history = list(saved["extra"].get("history", []))
    if changed:
        run.history.append({"step": run.step, "changed": changed})


def _load_whole(run, saved: dict) -> None:
    """A safetensors checkpoint's whole tensors into ``run``: copied, or cut to this rank's shards."""
    params = dict(run.model.named_parameters())
    missing = set(params) - set(saved["model"]) | set(params) - set(saved["ema"])
    if missing:
        raise checkpoint.CheckpointError(f"checkpoint lacks parameters {sorted(missing)[:5]}")
    check_optimizer(saved["optimizer"], saved["step"])
    with torch.no_grad():
        for (name, p), e in zip(params.items(), run.ema):
            for target, source in ((p, saved["model"][name]), (e, saved["ema"][name])):
                if hasattr(target, "full_tensor"):  # FSDP2: copy this rank's shard
                    from torch.distributed.tensor import distribute_tensor

                    source = distribute_tensor(source.to(run.device), target.device_mesh, target.placements)
                target.copy_(source)
    optim = saved["optimizer"]
    try:
        if _sharded(run) or any(isinstance(k, str) for k in optim["state"]):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            names = [name for name, _ in run.model.named_parameters()]  # model.parameters()'s order
            by_name = {
                "state": {names[k] if isinstance(k, int) else k: v for k, v in optim["state"].items()},
                "param_groups": [
                    g | {"params": [names[i] if isinstance(i, int) else i for i in g["params"]]}
                    for g in optim["param_groups"]
                ],
            }
            options = StateDictOptions(full_state_dict=True)
            set_optimizer_state_dict(run.model, run.optimizer, by_name, options=options)
        else:
            run.optimizer.load_state_dict(optim)
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as err:
        raise checkpoint.CheckpointError(f"checkpoint's optimizer state does not fit this model ({err})") from err


def _changes(run, saved: dict) -> dict[str, list]:
    """``{name: [checkpoint, now]}`` of the changed hyperparameters; refused unless ``allow_changes``."""
    now = asdict(run.cfg)
    changed = {k: [saved.get(k), now[k]] for k in HYPERPARAMETERS if saved.get(k) != now[k]}
    if changed and not run.cfg.allow_changes:
        detail = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in changed.items())
        raise checkpoint.CheckpointError(
            f"{run.out} was trained with other settings ({detail}): resume with the same ones, or pass "
            "--allow-changes to continue with the new ones (recorded in log.jsonl and config.json)"
        )
    return changed


def check_optimizer(optim: dict, step: int) -> None:
    """Every parameter's AdamW step count must be the checkpoint's: otherwise it was saved mid-step."""
    counts = {float(entry["step"]) for entry in optim["state"].values() if "step" in entry}
    if counts and counts != {float(step)}:
        raise checkpoint.CheckpointError(
            f"checkpoint of step {step} holds optimizer step counts {sorted(counts)}: saved in the middle "
            "of a step, not resumable exactly"
        )
