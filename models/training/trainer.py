"""The training loop behind ``python -m scripts.train``: one loop for every task.

AdamW with warm-up, gradient clipping, EMA weights, bf16 autocast on GPUs that have
it, a JSONL log, a loss curve, periodic validation and samples, and checkpoints that
resume to the same loss curve (data and noise are pure functions of seed and step).
Runs unchanged under ``torchrun``: DistributedDataParallel, or FSDP2 with ``fsdp``.
The settings are :class:`~models.training.config.TrainConfig`; each run writes them to
``OUT/config.json`` when it starts (or resumes), next to its checkpoint.
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

from . import checkpoint
from .config import RUN_KEYS, TrainConfig
from .pictures import plot_loss
from .tasks import TASKS

__all__ = ["Run", "TrainConfig", "learning_rate", "load_trained", "train", "trained_weights"]


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
        if cfg.model not in TASKS:
            raise ValueError(f"model must be one of {sorted(TASKS)}, got {cfg.model!r}")
        if cfg.preset not in TASKS[cfg.model].presets:
            raise ValueError(
                f"preset for {cfg.model} must be one of {sorted(TASKS[cfg.model].presets)}, got {cfg.preset!r}"
            )
        self.cfg = cfg
        self.distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        if self.distributed and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if torch.cuda.is_available():
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.task = TASKS[cfg.model].from_run(asdict(cfg))
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = self.task.build().to(self.device)
        self.trained = self._wrap(self.model)
        self.ema = [p.detach().clone() for p in self.model.parameters()]  # after wrapping: FSDP2 shards
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99)
        )
        bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and bf16)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()
        self.out = Path(cfg.out)
        self.step = 0

    def _wrap(self, model):
        if not self.distributed:
            return model
        if self.cfg.fsdp:
            from torch.distributed.fsdp import fully_shard

            for block in getattr(model, "blocks", getattr(model, "layers", [])):
                fully_shard(block)
            return fully_shard(model)
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    # -- state -------------------------------------------------------------------------

    def _full(self, tensors) -> list[torch.Tensor]:
        # FSDP2 holds DTensor shards: gather (a collective, so every rank calls it)
        return [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]

    def state(self) -> dict:
        state = self.model.state_dict()  # every name, tied aliases (GPT's output head) and buffers included
        model = dict(zip(state, self._full(state.values())))
        index = {id(p): i for i, p in enumerate(self.model.parameters())}
        ema_full = self._full(self.ema)
        named = self.model.named_parameters(remove_duplicate=False)
        ema = {name: ema_full[index[id(p)]] for name, p in named}
        if self.cfg.fsdp and self.distributed:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            optim = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(full_state_dict=True))
        else:
            optim = self.optimizer.state_dict()
        return {"model": model, "ema": ema, "optimizer": optim}

    def save(self) -> None:
        state = self.state()
        if self.rank == 0:
            checkpoint.save(self.out / "checkpoint.safetensors", step=self.step, run=asdict(self.cfg), **state)

    def restore(self) -> None:
        saved = checkpoint.load(self.out / "checkpoint.safetensors", run=asdict(self.cfg), keys=RUN_KEYS)
        params = dict(self.model.named_parameters())
        missing = set(params) - set(saved["model"])
        if missing:
            raise checkpoint.CheckpointError(f"checkpoint lacks parameters {sorted(missing)[:5]}")
        with torch.no_grad():
            for (name, p), e in zip(params.items(), self.ema):
                for target, source in ((p, saved["model"][name]), (e, saved["ema"][name])):
                    if hasattr(target, "full_tensor"):  # FSDP2: copy this rank's shard
                        from torch.distributed.tensor import distribute_tensor

                        source = distribute_tensor(source.to(self.device), target.device_mesh, target.placements)
                    target.copy_(source)
        if self.cfg.fsdp and self.distributed:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(
                self.model, self.optimizer, saved["optimizer"], options=StateDictOptions(full_state_dict=True)
            )
        else:
            self.optimizer.load_state_dict(saved["optimizer"])
        self.step = saved["step"]

    def ema_model(self) -> torch.nn.Module:
        """An unwrapped copy of the model holding the EMA weights (collective under FSDP)."""
        model = self.task.build().to(self.device)
        with torch.no_grad():
            for p, e in zip(model.parameters(), self._full(self.ema)):
                p.copy_(e)
        return model.eval()

    # -- the loop ----------------------------------------------------------------------

    def train_step(self) -> float:
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(cfg, self.step)
        with self.autocast:
            loss = self.task.loss(self.trained, self.step, cfg.batch_size, self.rank, self.world)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.ema, [p.detach() for p in self.model.parameters()], 1 - cfg.ema)
        loss = loss.detach()
        if self.distributed:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        self.step += 1
        return float(loss)

    def log(self, record: dict) -> None:
        if self.rank == 0:
            with open(self.out / "log.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def report(self, final: bool = False) -> None:
        """Validation loss, samples and the loss curve, from the EMA weights."""
        model = self.ema_model()
        if self.rank == 0:
            val = self.task.val_loss(model)
            self.log(
                {
                    "step": self.step,
                    "val_loss": sum(val.values()) / len(val),
                    "val": {str(k): v for k, v in val.items()},
                }
            )
            name = "samples" if final else f"samples_{self.step:06d}"
            self.task.save_samples(model, self.out / name, steps=self.cfg.sample_steps)
            plot_loss(self.out / "log.jsonl", self.out / "loss.png")

    def train(self) -> dict:
        cfg = self.cfg
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
        if cfg.resume:
            self.restore()
        elif self.rank == 0:
            (self.out / "log.jsonl").unlink(missing_ok=True)
        if self.rank == 0:  # the settings that trained the checkpoint from here on (resumes included)
            (self.out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
        bar = None
        if cfg.progress and self.rank == 0:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=self.step, desc=f"train {cfg.model}", dynamic_ncols=True)
        losses, tic, interrupted = [], time.perf_counter(), False
        try:
            while self.step < cfg.steps:
                loss = self.train_step()
                losses.append(loss)
                if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                    elapsed = time.perf_counter() - tic
                    rate = len(losses) * cfg.batch_size / elapsed
                    self.log(
                        {
                            "step": self.step,
                            "loss": sum(losses) / len(losses),
                            "lr": learning_rate(cfg, self.step - 1),
                            "samples_per_s": rate,
                        }
                    )
                    if bar is not None:
                        bar.set_postfix(loss=f"{loss:.4f}", samples_per_s=f"{rate:.0f}")
                    losses, tic = [], time.perf_counter()
                if bar is not None:
                    bar.update(1)
                if self.step % cfg.ckpt_every == 0:
                    self.save()
                if cfg.report and self.step % cfg.val_every == 0 and self.step < cfg.steps:
                    self.report()
        except KeyboardInterrupt:
            interrupted = True  # Ctrl-C: keep what was trained, then stop cleanly
        finally:
            if bar is not None:
                bar.close()
        self.save()
        if cfg.report and not interrupted:
            self.report(final=True)
        return {"step": self.step, "interrupted": interrupted, "out": str(self.out)}


def trained_weights(path: str | Path, *, use_ema: bool = True) -> tuple[dict, dict[str, torch.Tensor]]:
    """The run settings and model weights of a checkpoint (EMA parameters unless ``use_ema=False``)."""
    saved = checkpoint.load(path)
    return saved["run"], saved["model"] | (saved["ema"] if use_ema else {})


def load_trained(path: str | Path, *, use_ema: bool = True, device: str | torch.device = "cpu"):
    """Rebuild a trained model from its checkpoint; returns ``(task, model)`` with the model in eval mode."""
    run, weights = trained_weights(path, use_ema=use_ema)
    task = TASKS[run["model"]].from_run(run)
    model = task.build()
    model.load_state_dict(weights)
    return task, model.to(device).eval()


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns ``{"step", "interrupted", "out"}``."""
    run = Run(cfg)
    try:
        return run.train()
    finally:
        if run.distributed and dist.is_initialized():
            dist.destroy_process_group()
