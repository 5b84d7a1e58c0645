"""How a run spreads over processes: the (dp, cp) device mesh, and the model's preparation on it.

A run of ``W`` processes is a 2-D mesh ``[dp, cp]`` (row-major: rank ``r`` is replica ``r // cp``,
context rank ``r % cp``), so the ranks ``[k cp, (k + 1) cp)`` share the videos of replica ``k``.
:func:`plan` checks the layout from the settings and ``W`` alone, identically on every rank and
before any collective, so a bad layout is one clear error on every rank, never a hang.

The model is prepared per block, in the order torchtitan uses (activation checkpointing, then
compile, then FSDP2): each block's forward is recomputed in the backward (``--checkpointing``,
``torch.utils.checkpoint`` non-reentrant), compiled on its own (``--compile``: regional, as
diffusers' ``compile_repeated_blocks``: the repeated blocks share one graph), then sharded with
``fully_shard``. FSDP2 shards over all ``dp x cp`` ranks (the flattened mesh): under context
parallel the ranks of a context group hold the same weights and their gradients are averaged
over all ``W`` ranks anyway, so sharding over ``dp`` alone would keep ``cp`` copies for nothing
(torchtitan's ``dp_shard_cp`` does the same). Under FSDP2 the model is built on the meta device,
sharded, materialised with ``to_empty`` and initialised by :func:`sharded_init`: the weights of
``torch.manual_seed(s); task.build()`` in one process, while no rank holds more than one whole
parameter at a time.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from .config import TrainConfig

__all__ = [
    "Layout",
    "PeerFailed",
    "build_mesh",
    "compile_backends",
    "init_process_group",
    "on_rank0",
    "plan",
    "prepare",
    "sharded_init",
]


@dataclass(frozen=True)
class Layout:
    """The mesh of a run: ``world = data_parallel * context_parallel`` processes."""

    world: int
    data_parallel: int
    context_parallel: int


def compile_backends() -> list[str]:
    """The ``torch.compile`` backends this torch knows (``torch._dynamo.list_backends``, every tag)."""
    return torch._dynamo.list_backends(exclude_tags=())


def plan(cfg: TrainConfig, task, world: int) -> Layout:
    """The mesh of ``cfg`` on ``world`` processes, or a ``ValueError`` naming the setting that does not fit.

    Pure (no collective, no device): every rank computes the same answer, so every rank raises the same error.
    """
    P = cfg.context_parallel
    if world % P:
        raise ValueError(
            f"context_parallel {P} must divide the number of processes {world} (torchrun --nproc-per-node)"
        )
    dp = cfg.data_parallel or world // P
    if dp * P != world:
        raise ValueError(
            f"data_parallel {dp} x context_parallel {P} must equal the number of processes {world} "
            "(data_parallel 0: the processes left over, world / context_parallel)"
        )
    if cfg.batch_size % dp:  # the processes, or under context parallel the groups (world / P)
        raise ValueError(f"batch_size {cfg.batch_size} must divide by the data-parallel ranks {dp}")
    if P > 1:
        heads = task.config.num_heads
        if cfg.cp_method == "ulysses" and heads % P:
            raise ValueError(f"cp_method 'ulysses' shards the {heads} heads over {P} ranks: use 'ring'")
        pt, py, px = task.config.patch_size
        tokens = (cfg.frames // pt) * (cfg.resolution // py) * (cfg.resolution // px)
        if tokens < P:
            raise ValueError(
                f"context_parallel {P} shards each video's {tokens} tokens (frames {cfg.frames}, resolution "
                f"{cfg.resolution}, patch {task.config.patch_size}): at least one token per rank, so at most {tokens}"
            )
    if cfg.compile and cfg.compile_backend not in compile_backends():
        raise ValueError(
            f"compile_backend must be one of torch.compile's backends {compile_backends()}, got {cfg.compile_backend!r}"
        )
    return Layout(world, dp, P)


class PeerFailed(RuntimeError):
    """Rank 0 failed in work that only it does (:func:`on_rank0`): the other ranks stop with its message."""


def on_rank0(work: Callable[[], object]) -> object:
    """``work()`` on rank 0 alone (the run folder's files are rank 0's), then every rank learns whether it failed:
    rank 0 raises its own error, the others a :class:`PeerFailed` carrying its message. Collective: every rank
    calls it at the same point. Without it, rank 0 stopped with one clear line while the others died in a
    traceback in their next collective ("Connection closed by peer"). One process: ``work()``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return work()
    error, result = None, None
    if dist.get_rank() == 0:
        try:
            result = work()
        except Exception as err:  # any: the others must not be left waiting for rank 0
            error = err
    message = [None if error is None else " ".join(str(error).split())]
    dist.broadcast_object_list(message, src=0)  # a str, or None: the one thing the ranks agree on
    if error is not None:
        raise error
    if message[0] is not None:
        raise PeerFailed(f"rank {dist.get_rank()} stops: rank 0 failed ({message[0]})")
    return result


def init_process_group(backend: str) -> None:
    """``torch.distributed.init_process_group`` for torchrun's workers, a restart's keys apart from the last one's.

    After an elastic restart (``TORCHELASTIC_RESTART_COUNT`` > 0) a restarted rank was once seen connecting to
    a dead port, most likely the killed attempt's address still in the agent's store under the same key; so
    each attempt's process group keys the store under its own prefix (tests/test_distributed_elastic.py).
    """
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend, store=dist.PrefixStore(f"attempt_{attempt}", store), rank=rank, world_size=world)


def build_mesh(layout: Layout, device_type: str):
    """The ``("dp", "cp")`` device mesh of ``layout`` (collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = (layout.data_parallel, layout.context_parallel)
    return init_device_mesh(device_type, shape, mesh_dim_names=("dp", "cp"))


def blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The repeated blocks of a model: the DiTs' ``blocks``, the language model's ``layers``."""
    return model.blocks if hasattr(model, "blocks") else model.layers


def _recomputed(forward, *args, **kwargs):
    # non-reentrant: works with keyword arguments, FSDP2's hooks and torch.compile (a higher-order op)
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def prepare(model: torch.nn.Module, cfg: TrainConfig, mesh=None) -> torch.nn.Module:
    """Checkpoint, compile and (``mesh`` given and ``cfg.fsdp``) shard each block of ``model``, in place.

    The parameter names stay the model's own (no wrapper module): checkpoints and exports read the same keys.
    """
    for block in blocks(model):
        if cfg.checkpointing:
            block.forward = functools.partial(_recomputed, block.forward)
        if cfg.compile:
            block.compile(backend=cfg.compile_backend)
    if mesh is not None and cfg.fsdp:
        from torch.distributed.fsdp import fully_shard

        flat = mesh["dp", "cp"]._flatten("dp_cp")  # every rank: see the module docstring
        for block in blocks(model):
            fully_shard(block, mesh=flat)
        fully_shard(model, mesh=flat)
    return model


# in-place draws that fill a tensor from the generator alone: drawn whole, then sharded
RANDOM_FILLS = frozenset(
    ("normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "random_")
)


def _fills_from_nothing(func) -> bool:
    # torch.nn.init's functions (xavier_uniform_, normal_, zeros_, ...) overwrite their tensor without reading
    # it, and reach a torch-function mode as themselves (tensor= keyword), not as the Tensor method they call
    return getattr(func, "__module__", None) == "torch.nn.init" or getattr(func, "__name__", None) in RANDOM_FILLS


class _ShardedDraws(TorchFunctionMode):
    """Every fill of a sharded parameter (a DTensor) by ``torch.nn.init`` or a random ``Tensor`` method draws
    the whole parameter on the CPU generator, as one process does, and keeps this rank's shard. Other
    in-place ops (``zero_``, ``fill_``, ``mul_``) are elementwise: DTensor runs them on each shard, unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor, distribute_tensor

        kwargs = dict(kwargs or {})
        target = args[0] if args else kwargs.get("tensor")
        if not (_fills_from_nothing(func) and isinstance(target, DTensor)):
            return func(*args, **kwargs)
        whole = torch.empty(target.shape, dtype=target.dtype)  # on the CPU: one process draws there too
        if args:
            func(whole, *args[1:], **kwargs)
        else:
            func(**(kwargs | {"tensor": whole}))
        shard = distribute_tensor(whole, target.device_mesh, target.placements, src_data_rank=None).to_local()
        target.to_local().copy_(shard)
        return target


def sharded_init(model: torch.nn.Module, device: torch.device, seed: int) -> None:
    """Materialise a model built on the meta device and sharded, and initialise it as one process would.

    ``to_empty`` gives each rank memory for its shards only; ``reset_parameters`` then runs with the
    generator seeded as ``torch.manual_seed(seed); task.build()`` seeds it, each random fill drawn
    whole (one parameter at a time) and cut to this rank's shard.
    """
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad(), _ShardedDraws():
        model.reset_parameters()


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters this rank holds (its shards under FSDP2)."""
    local = (p.to_local() if hasattr(p, "to_local") else p for p in model.parameters())
    return sum(math.prod(t.shape) * t.element_size() for t in local)
