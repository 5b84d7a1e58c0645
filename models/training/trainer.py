"""The training loop behind ``python -m scripts.train``: one loop for every task.

AdamW with warm-up, gradient clipping, EMA weights, bf16 autocast on GPUs that have
it, a JSONL log, a loss curve, periodic validation and samples, and checkpoints that
resume to the same loss curve (data and noise are pure functions of seed and step).
Runs unchanged under ``torchrun``: DistributedDataParallel, or FSDP2 with ``fsdp``; with
``context_parallel`` P > 1 (the video DiT), each video is sharded over P consecutive ranks
and the batch over the ``world / P`` data-parallel replicas (docs/distributed.md).
The settings are :class:`~models.training.config.TrainConfig`; each run writes them to
``OUT/config.json`` when it starts (or resumes), next to its checkpoint.

Faults (docs/training.md, "What is guaranteed"): Ctrl-C and SIGTERM stop at a step boundary
and save; a non-finite loss or gradient stops the run before it touches the weights, and
the last checkpoint is kept; one run at a time per folder, and a fresh run never replaces
one there unless told to; a resume keeps the optimisation settings unless told otherwise.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from axial_rope.parallel import ContextParallel

from . import checkpoint, distributed, run_state, rundir, sharded_checkpoint
from .config import TrainConfig
from .pictures import plot_loss
from .run_checks import check_run
from .stopping import DeferredStop
from .tasks import TASKS

__all__ = [
    "Run",
    "TrainConfig",
    "TrainingDiverged",
    "export_weights",
    "learning_rate",
    "load_trained",
    "train",
    "trained_weights",
]


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN or infinite: the run stopped before the weights did."""


def learning_rate(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.schedule == "cosine":
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))
    return cfg.lr


class Run:
    """The state of one process in a (possibly distributed) run."""

    def __init__(self, cfg: TrainConfig):
        task = check_run(cfg)
        self.cfg = cfg
        self.distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        # the layout is checked from the settings and the world size alone, before any collective: a bad
        # one is the same error on every rank, never a hang (models/training/distributed.py)
        self.layout = distributed.plan(cfg, task, int(os.environ["WORLD_SIZE"]) if self.distributed else 1)
        if self.distributed and not dist.is_initialized():
            distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if torch.cuda.is_available():
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.mesh = distributed.build_mesh(self.layout, self.device.type) if self.distributed else None
        self.cp, self.data_rank, self.data_world = self._context_parallel()
        self.task = task
        self.model, self.trained = self._build()
        self.ema = [p.detach().clone() for p in self.model.parameters()]  # after wrapping: FSDP2 shards
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99)
        )
        bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and bf16)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()
        self.out = Path(cfg.out)
        self.step = 0
        self.window: list[float] = []  # the losses since the last log record (saved: a resume continues it)
        self.history: list[dict] = []  # hyperparameter changes of earlier resumes
        self.busy = False  # inside a step: the state may be half an update, never saved
        self.saved_step: int | None = None

    def _build(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """``(model, trained)``: the model (sharded in place under FSDP2) and what the loss calls (DDP's wrapper)."""
        cfg = self.cfg
        if self.mesh is not None and cfg.fsdp:  # built on meta, sharded, then materialised shard by shard
            with torch.device("meta"):
                model = self.task.build()
            distributed.prepare(model, cfg, self.mesh)
            distributed.sharded_init(model, self.device, cfg.seed)
            return model, model
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        model = distributed.prepare(self.task.build().to(self.device), cfg)
        if not self.distributed:
            return model, model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return model, DistributedDataParallel(model, device_ids=ids)

    # -- context parallel (docs/distributed.md) -------------------------------------------

    def _context_parallel(self) -> tuple[ContextParallel | None, int, int]:
        """``(cp, data_rank, data_world)``: this rank's sharding of a video (``None``: P = 1) and its
        data-parallel replica: the mesh's ``cp`` group and ``dp`` coordinate (models/training/distributed.py)."""
        if self.mesh is None:
            return None, 0, 1
        data_rank, data_world = self.mesh.get_local_rank("dp"), self.layout.data_parallel
        if self.layout.context_parallel == 1:
            return None, data_rank, data_world
        cp = ContextParallel(self.mesh.get_group("cp"), self.cfg.cp_method, self.cfg.cp_layout)
        return cp, data_rank, data_world

    def _loss(self) -> torch.Tensor:
        """The loss this rank backpropagates (under context parallel: its share, times P)."""
        cfg = self.cfg
        if self.cp is None:
            return self.task.loss(self.trained, self.step, cfg.batch_size, self.data_rank, self.data_world)
        share = self.task.loss(
            self.trained, self.step, cfg.batch_size, self.data_rank, self.data_world, context_parallel=self.cp
        )
        # The P shares of a context group add up to its replica's mean loss, and their gradients to its
        # gradient. DDP and FSDP2 average gradients over all W = P * D ranks, which is 1/P of the mean over
        # the D replicas of each group's sum: times P, it is the global batch's gradient, as one process
        # computes it. The logged loss, the world average of these, is then the global mean loss too.
        return share * self.cp.world

    def _report_sharding(self) -> tuple[dict, bool]:
        """The report's model keywords, and whether this rank (not 0) takes part: rank 0's context group."""
        return ({}, False) if self.cp is None else ({"context_parallel": self.cp}, 0 < self.rank < self.cp.world)

    # -- state (models/training/run_state.py) --------------------------------------------

    def save(self) -> None:
        """Write the checkpoint of this step (a whole number of steps: never called inside one; collective)."""
        run_state.save(self)
        self.saved_step = self.step

    def restore(self) -> None:
        run_state.restore(self)

    def ema_model(self) -> torch.nn.Module:
        """An unwrapped copy of the model holding the EMA weights (collective under FSDP)."""
        model = self.task.build().to(self.device)
        with torch.no_grad():
            for p, e in zip(model.parameters(), run_state._full(self.ema)):
                p.copy_(e)
        return model.eval()

    # -- the loop ----------------------------------------------------------------------

    def train_step(self) -> float:
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(cfg, self.step)
        with self.autocast:
            loss = self._loss()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # the norm is needed unclipped too: a non-finite gradient stops the run before the update
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip or math.inf)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        loss = loss.detach()
        if self.distributed:  # every rank sees the same loss and gradient norm: they stop together
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        if not (torch.isfinite(loss) and torch.isfinite(norm)):
            raise TrainingDiverged(
                f"training diverged at step {self.step + 1} (loss {float(loss)}, gradient norm {float(norm)}): "
                f"stopped before the update; {self._kept()}. Lower --lr or --grad-clip and --resume"
            )
        # from here to the step's log record the state is half a step: a forced stop saves nothing
        self.busy = True
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.ema, [p.detach() for p in self.model.parameters()], 1 - cfg.ema)
        self.step += 1
        return float(loss)

    def _kept(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"the checkpoint of step {self.saved_step} is kept"

    def log(self, record: dict) -> None:
        if self.rank == 0:
            with open(self.out / "log.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def report(self, final: bool = False) -> None:
        """Validation loss, samples and the loss curve, from the EMA weights."""
        model = self.ema_model()
        kw, collective = self._report_sharding()
        if collective:  # the other ranks of rank 0's context group: the same collectives, nothing written
            self.task.val_loss(model, **kw)
            self.task.sample(model, steps=self.cfg.sample_steps, **kw)
        if self.rank == 0:
            val = self.task.val_loss(model, **kw)
            self.log(
                {
                    "step": self.step,
                    "val_loss": sum(val.values()) / len(val),
                    "val": {str(k): v for k, v in val.items()},
                }
            )
            name = "samples" if final else f"samples_{self.step:06d}"
            self.task.save_samples(model, self.out / name, steps=self.cfg.sample_steps, **kw)
            plot_loss(self.out / "log.jsonl", self.out / "loss.png")

    def _start(self) -> None:
        """Resume or start fresh (rank 0 holds the folder's lock), and write config.json. The folder's files are
        rank 0's: a failure there stops every rank at once (:func:`~models.training.distributed.on_rank0`)."""
        cfg = self.cfg
        resume = cfg.resume or self._restarted_after_a_save()
        distributed.on_rank0(lambda: self._prepare_folder(resume))
        if resume:
            self.restore()
            if self.step > cfg.steps:  # every rank read the same step: the same error on each, nothing written
                raise checkpoint.CheckpointError(
                    f"steps {cfg.steps} is below the {self.step} steps the checkpoint in {self.out} has done: nothing "
                    f"to train (a resume trains up to steps); pass steps above {self.step} to train longer"
                )
        distributed.on_rank0(lambda: self._write_start(resume))

    def _prepare_folder(self, resume: bool) -> None:
        checkpoint.remove_temporaries(self.out)  # left by saves that were killed
        sharded_checkpoint.remove_temporaries(self.out)
        if not resume:
            rundir.start_fresh(self.out, self.cfg.overwrite)
            if self.cfg.overwrite:
                sharded_checkpoint.remove(self.out)

    def _write_start(self, resume: bool) -> None:
        if resume:
            rundir.truncate_log(self.out / "log.jsonl", self.step)  # a killed run logged steps past it
            if self.history and self.history[-1]["step"] == self.step:
                self.log(self.history[-1])
        # the settings that trained the checkpoint from here on (resumes included)
        settings = asdict(self.cfg) | ({"history": self.history} if self.history else {})
        (self.out / "config.json").write_text(json.dumps(settings, indent=2))

    def _restarted_after_a_save(self) -> bool:
        """An elastic restart (``torchrun --max-restarts``: ``TORCHELASTIC_RESTART_COUNT`` > 0) of a run that has
        a checkpoint: it resumes from there, whatever the command said. Without one, the command's own rules
        hold (a fresh run into a folder that holds the killed attempt's log is refused: nothing to resume)."""
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
            return False
        return sharded_checkpoint.exists(self.out) or (self.out / run_state.SAFETENSORS).is_file()

    def _stop_requested(self, stop: DeferredStop) -> bool:
        if not self.distributed:
            return stop.requested is not None
        flag = torch.tensor(float(stop.requested is not None), device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one rank's signal stops all, at the same step
        return bool(flag)

    def _after_step(self, loss: float, tic: float) -> float:
        """Log, save and report as the settings say; returns the start time of the next log window."""
        cfg = self.cfg
        self.window.append(loss)
        if self.step % cfg.log_every == 0 or self.step == cfg.steps:
            rate = len(self.window) * cfg.batch_size / (time.perf_counter() - tic)
            mean = sum(self.window) / len(self.window)
            record = {"step": self.step, "loss": mean, "lr": learning_rate(cfg, self.step - 1), "samples_per_s": rate}
            # rank 0 appends it; a failed write (a full disk) stops every rank with its message, not a peer traceback
            distributed.on_rank0(lambda: self.log(record))
            self.window, tic = [], time.perf_counter()
        if self.step % cfg.ckpt_every == 0:
            self.save()
        return tic

    def train(self) -> dict:
        cfg = self.cfg
        with contextlib.ExitStack() as held:
            # rank 0 holds the folder's lock; a folder it cannot make or lock stops every rank here
            distributed.on_rank0(lambda: held.enter_context(rundir.RunLock(self.out)))
            stop = held.enter_context(DeferredStop())
            self._start()
            resumed_done = self.step == cfg.steps  # a resume of a finished run: nothing to train
            bar = None
            if cfg.progress and self.rank == 0:
                from tqdm import tqdm

                bar = tqdm(total=cfg.steps, initial=self.step, desc=f"train {cfg.model}", dynamic_ncols=True)
            tic, interrupted, consistent = time.perf_counter(), False, True
            try:
                while self.step < cfg.steps:
                    if self._stop_requested(stop):
                        interrupted = True
                        break
                    loss = self.train_step()  # sets busy when it starts changing the state
                    tic = self._after_step(loss, tic)
                    self.busy = False  # the step, its loss in the log window and its record: all done
                    if bar is not None:
                        bar.set_postfix(loss=f"{loss:.4f}")
                        bar.update(1)
                    if cfg.report and self.step % cfg.val_every == 0 and self.step < cfg.steps:
                        if not self._stop_requested(stop):  # agreed by all ranks: the report may be collective
                            self.report()
            except KeyboardInterrupt:  # a second Ctrl-C (or one raised by code, not a signal we defer)
                interrupted, consistent = True, not self.busy
            finally:
                if bar is not None:
                    bar.close()
            interrupted = interrupted or stop.requested is not None
            try:
                if consistent and self.saved_step != self.step:
                    self.save()
                if cfg.report and not interrupted:
                    self.report(final=True)
            except KeyboardInterrupt:  # a second Ctrl-C in the final save or report. A save is atomic: the file
                interrupted = True  # holds this step if the rename was done, else the last checkpoint, untouched
                with contextlib.suppress(checkpoint.CheckpointError):  # none on disk: saved_step stays None
                    self.saved_step = run_state.saved_step(self.out) if self.rank == 0 else self.saved_step
                consistent = consistent and self.saved_step == self.step
        result = {"step": self.step, "interrupted": interrupted, "out": str(self.out)}
        if resumed_done:
            result["nothing_to_train"] = True
        if not consistent:  # stopped inside a step: only the last checkpoint holds (None: there is none)
            result |= {"step": self.saved_step, "unsaved": True}
        return result


def trained_weights(path: str | Path, *, use_ema: bool = True) -> tuple[dict, dict[str, torch.Tensor]]:
    """The run settings and model weights of a checkpoint (EMA parameters unless ``use_ema=False``): a
    ``checkpoint.safetensors``, or a run folder holding one or an FSDP2 run's DCP checkpoint (read whole)."""
    if Path(path).is_dir() and sharded_checkpoint.exists(path):
        run = sharded_checkpoint.metadata(path)["run"]
        return run, sharded_checkpoint.export(path, TASKS[run["model"]].from_run(run), use_ema=use_ema)
    saved = checkpoint.load(path)
    return saved["run"], saved["model"] | (saved["ema"] if use_ema else {})


def export_weights(run_dir: str | Path, path: str | Path) -> Path:
    """One consolidated safetensors checkpoint of a run folder (either format, DCP included) for inference: the
    model and EMA weights whole, no optimizer state; :func:`load_trained`, ``scripts.sample --checkpoint PATH``
    and the diffusers exports (models/training/export.py) read it. ``path`` may be an earlier export, never
    training state (:func:`~models.training.run_state.export_refusal`: a ``CheckpointError`` saying why)."""
    if (refusal := run_state.export_refusal(run_dir, path)) is not None:
        raise checkpoint.CheckpointError(f"{path} {refusal}")
    run, model = trained_weights(run_dir, use_ema=False)
    _, ema = trained_weights(run_dir, use_ema=True)
    empty = {"state": {}, "param_groups": []}
    extra = {checkpoint.EXPORTED: str(run_dir)}
    return checkpoint.save(
        path, model=model, ema=ema, optimizer=empty, step=run_state.saved_step(run_dir), run=run, extra=extra
    )


def load_trained(path: str | Path, *, use_ema: bool = True, device: str | torch.device = "cpu"):
    """Rebuild a trained model from its checkpoint; returns ``(task, model)`` with the model in eval mode."""
    run, weights = trained_weights(path, use_ema=use_ema)
    task = TASKS[run["model"]].from_run(run)
    model = task.build()
    model.load_state_dict(weights)
    return task, model.to(device).eval()


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns ``{"step", "interrupted", "out"}``, with ``"unsaved": True`` after a
    forced stop inside a step, ``"nothing_to_train": True`` when resumed at ``cfg.steps`` already. A resume from
    a checkpoint past ``cfg.steps`` is a :class:`~models.training.checkpoint.CheckpointError`."""
    run = Run(cfg)
    try:
        return run.train()
    finally:
        if run.distributed and dist.is_initialized():
            dist.destroy_process_group()
