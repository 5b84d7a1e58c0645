"""Checkpoints of FSDP2 runs in ``torch.distributed.checkpoint`` (DCP): each rank writes its shards, any
world size reads them back.

A run folder's ``checkpoint.dcp`` is a symbolic link to the folder of the newest save,
``checkpoint-dcp-<step>-<nonce>/``: DCP's files (``__<rank>_0.distcp``, ``.metadata``) and
``meta.json`` (format, step, run settings, the trainer's extra JSON, a checksum of every file and
of itself). A save writes a new folder, checks it, then swaps the link with ``os.replace``
(atomic): a save killed at any point leaves the previous checkpoint loadable; the folders of
killed saves are removed by :func:`remove_temporaries`. The state: the model and AdamW
(``get_state_dict``: names, not indices, so a resume may shard differently), the EMA weights under
the model's parameter names, and the data position, which is the step (data and noise are pure
functions of seed and step: models/training/tasks.py; the trainer holds no other random state).
Loading (``set_state_dict``) reshards to the world that loads: 4 -> 2 -> 1 processes, or 1 -> 4.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import CheckpointError
from .distributed import on_rank0

__all__ = ["LINK", "exists", "export", "is_state_path", "load", "metadata", "remove", "remove_temporaries", "save"]

LINK = "checkpoint.dcp"
FORMAT = "axial_rope-train-dcp-1"
_PREFIX = "checkpoint-dcp-"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _file_checksum(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _meta_checksum(meta: dict) -> str:
    body = json.dumps({k: v for k, v in meta.items() if k != "meta_checksum"}, sort_keys=True)
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


def exists(folder: str | Path) -> bool:
    return (Path(folder) / LINK).is_symlink()


def is_state_path(folder: str | Path, path: str | Path) -> bool:
    """Whether ``path`` is part of the DCP checkpoint of the run ``folder``: its link, a save folder (finished
    or not) or a file in one. Compared with both resolved, the last part of ``path`` unfollowed (a link)."""
    run = Path(os.path.realpath(folder))
    here = Path(os.path.realpath(Path(path).parent)) / Path(path).name
    ours = (LINK, f".{LINK}.", _PREFIX, f".{_PREFIX}")  # the link, one not swapped in yet, the save folders
    return any(p.parent == run and p.name.startswith(ours) for p in (here, *here.parents))


def _state(model: torch.nn.Module, optimizer, ema: list[torch.Tensor]) -> dict:
    """DCP's state: the model's and the optimizer's by parameter name, and the EMA under the same names."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # initialises AdamW's state if empty (lr 0)
    names = [name for name, _ in model.named_parameters()]  # model.parameters()'s order: the EMA list's
    return {"model": model_state, "optim": optim_state, "ema": dict(zip(names, ema))}


def save(folder: str | Path, *, model, optimizer, ema: list, step: int, run: dict, extra: dict) -> Path:
    """Write the checkpoint of ``step`` (collective: every rank calls it); returns its folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    folder = Path(folder)
    local = [t.to_local() if hasattr(t, "to_local") else t for t in (*model.parameters(), *ema)]
    finite = torch.tensor(float(all(bool(torch.isfinite(t).all()) for t in local)))
    nonce = [uuid.uuid4().hex[:8]]
    if _distributed():  # the ranks agree on the folder's name and on whether the weights are finite
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        dist.broadcast_object_list(nonce, src=0)
    if not finite:  # NaN weights never replace a checkpoint
        raise CheckpointError(f"non-finite weights at step {step}: not saved, the checkpoint in {folder} is kept")
    target = folder / f".{_PREFIX}{step:06d}-{nonce[0]}"  # hidden until it is complete
    kept = f"the checkpoint in {folder}, if any, is unchanged"
    try:
        dcp.save(_state(model, optimizer, ema), checkpoint_id=str(target))
    except CheckpointException as err:  # every rank gets it (DCP gathers the ranks' writes): a full disk, a limit
        if _rank() == 0:
            shutil.rmtree(target, ignore_errors=True)
        raise CheckpointError(
            f"could not write the checkpoint of step {step} ({_first_failure(err)}): {kept}"
        ) from None
    _barrier()
    final = folder / target.name[1:]

    def publish() -> None:  # rank 0, once every rank's files are written
        try:
            _publish(folder, target, final, nonce[0], {"format": FORMAT, "step": step, "run": run, "extra": extra})
        except OSError as err:  # the link not swapped: the new folder goes, under either name
            for path in (target, final):
                if (folder / LINK).resolve() != path.resolve():
                    shutil.rmtree(path, ignore_errors=True)
            raise CheckpointError(f"could not write the checkpoint of step {step} ({err}): {kept}") from err

    on_rank0(publish)  # a failure there stops every rank (models/training/distributed.py)
    return final


def _first_failure(err) -> str:
    """One line from DCP's ``CheckpointException``: the first failing rank and its exception."""
    rank, (exc, _) = next(iter(err.failures.items()))
    return f"rank {rank}: {type(exc).__name__}: {' '.join(str(exc).split())}"


def _publish(folder: Path, target: Path, final: Path, nonce: str, meta: dict) -> None:
    """Checksum and fsync the save folder ``target``, rename it ``final``, swap the link to it, drop older ones."""
    files = sorted(p for p in target.iterdir() if p.is_file())
    for path in files:  # on disk before the link moves: a power cut leaves the old checkpoint
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
    meta["checksums"] = {p.name: _file_checksum(p) for p in files}
    meta["meta_checksum"] = _meta_checksum(meta)
    (target / "meta.json").write_text(json.dumps(meta))
    os.replace(target, final)
    link = folder / f".{LINK}.{nonce}"
    os.symlink(final.name, link)
    os.replace(link, folder / LINK)  # the one atomic step: from here the new checkpoint is the run's
    for old in folder.glob(f"{_PREFIX}*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Remove what killed saves left in ``folder`` (hidden save folders, links not swapped in); returns them."""
    folder = Path(folder)
    stale = sorted([*folder.glob(f".{_PREFIX}*"), *folder.glob(f".{LINK}.*")])
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def remove(folder: str | Path) -> None:
    """Remove the DCP checkpoint of ``folder`` (a later save of the other format superseded it)."""
    folder = Path(folder)
    (folder / LINK).unlink(missing_ok=True)
    for old in folder.glob(f"{_PREFIX}*"):
        shutil.rmtree(old, ignore_errors=True)


def _checked(folder: str | Path) -> tuple[Path, dict]:
    """The save folder that ``folder``'s link names and its verified ``meta.json``."""
    link = Path(folder) / LINK
    path = link.resolve() if link.is_symlink() else Path(folder)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"no readable DCP checkpoint at {path} ({err})") from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an axial_rope DCP training checkpoint")
    if meta.get("meta_checksum") != _meta_checksum(meta):
        raise CheckpointError(f"{path}/meta.json (step, run settings) fails its checksum: corrupt")
    files = {p.name for p in path.iterdir() if p.is_file() and p.name != "meta.json"}
    if files != set(meta["checksums"]):
        raise CheckpointError(
            f"{path}: its files and their checksums disagree ({sorted(files ^ set(meta['checksums']))})"
        )
    bad = [name for name, digest in meta["checksums"].items() if _file_checksum(path / name) != digest]
    if bad:
        raise CheckpointError(f"{path}: {bad} fail their checksums: corrupt")
    return path, meta


def metadata(folder: str | Path) -> dict:
    """``{"step", "run", "extra"}`` of a run folder's DCP checkpoint, checked."""
    _, meta = _checked(folder)
    return {"step": meta["step"], "run": meta["run"], "extra": meta["extra"]}


def load(folder: str | Path, *, model, optimizer, ema: list, run: dict, keys: tuple[str, ...]) -> dict:
    """Load a run folder's DCP checkpoint into ``model``, ``optimizer`` and ``ema`` in place, resharded to this
    world (collective); returns ``{"step", "run", "extra"}``. Every key in ``keys`` must equal ``run``'s."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path, meta = _checked(folder)  # every rank reads and checks the same files: the same error on each
    diff = {k: (meta["run"].get(k), run.get(k)) for k in keys if meta["run"].get(k) != run.get(k)}
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"{path} belongs to another run ({detail})")
    state = _state(model, optimizer, ema)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except (RuntimeError, ValueError, KeyError) as err:  # DCP wraps a rank's failure in a CheckpointException
        raise CheckpointError(f"{path} does not fit this model ({type(err).__name__}: {err})") from err
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return {"step": meta["step"], "run": meta["run"], "extra": meta["extra"]}


def export(folder: str | Path, task, *, use_ema: bool = True) -> dict[str, torch.Tensor]:
    """The whole weights of a run folder's DCP checkpoint, read in one process (the EMA parameters unless
    ``use_ema=False``, the model's buffers), keyed as ``task.build()``'s state dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    path, _ = _checked(folder)
    model = task.build()
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    names = [name for name, _ in model.named_parameters()]
    state = {"model": weights, "ema": {name: weights[name].clone() for name in names}}
    dcp.load(state, checkpoint_id=str(path), planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
    if not use_ema:
        return state["model"]
    # tied parameters (GPT's output head) are saved once, under their first name: every alias takes its EMA
    first = {id(p): name for name, p in model.named_parameters()}
    aliases = model.named_parameters(remove_duplicate=False)
    return state["model"] | {name: state["ema"][first[id(p)]] for name, p in aliases}
