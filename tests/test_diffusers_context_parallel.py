"""The adapter under diffusers' own context parallelism (``enable_parallelism``, Ulysses over 2 gloo CPU processes).

diffusers 0.42.1 builds the context-parallel device as ``rank % torch.accelerator.device_count()``
(``ModelMixin._resolve_parallel_config``), zero on a machine without an accelerator; the workers report one device, so
the mesh is built on the CPU, and everything else runs as diffusers wrote it (its hooks shard the inputs of Flux's
``_cp_plan``, ids included, and gather ``proj_out``). Tiny Flux in float64, 4 text and 24 image tokens (the shards
must divide). Sharded and whole runs differ in the order of the attention's sums only (Ulysses' all-to-all moves heads,
not sums), so the claims are equalities to float64 rounding: ``TOL``.

- Our processors, unscaled and with a fixed scaling on ``(y, x)``, on the sharded model equal the same install
  unsharded (installed before ``enable_parallelism`` or after it); removed, the sharded stock model equals the
  unsharded one.
- ``mode=`` sizes positions by the forward's grid, which the shards split (each rank would size its shard: 0.0044 off
  before it was refused): refused at the forward with what to pass instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

diffusers = pytest.importorskip("diffusers")

TOL = 1e-12  # float64 rounding of outputs of scale < 3 through two blocks, summed in other orders (chain_bound U64)


def _worker(rank: int, world: int, tmp: str) -> None:
    torch.set_num_threads(1)
    torch.accelerator.device_count = lambda: 1  # the CPU as diffusers' context-parallel device (see the docstring)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    try:
        torch.save(_checks(), Path(tmp) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _checks() -> dict:
    from diffusers import ContextParallelConfig

    import axial_rope as ar
    from axial_rope.integrations.diffusers import set_rope_processors
    from models import tiny_diffusers as tiny

    def build():
        model, inputs = tiny.build("FluxTransformer2DModel")
        inputs = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
        text = inputs["encoder_hidden_states"][:, :4]  # 4 text tokens: shards of equal size
        return model.double(), dict(inputs, encoder_hidden_states=text, txt_ids=inputs["txt_ids"][:4])

    def run(model, inputs):
        with torch.no_grad():
            return model(**inputs)[0]

    linear = dict(scaling=(None, ar.scaling.Linear(2.0), ar.scaling.Linear(2.0)))
    model, inputs = build()
    stock = run(model, inputs)
    want = {}
    for name, kw in (("unscaled", {}), ("linear", linear)):  # stock rotates a float64 model in float32: ours does not
        handle = set_rope_processors(model, **kw)
        want[name] = run(model, inputs)
        handle.remove()
    out = {}
    config = ContextParallelConfig(ulysses_degree=dist.get_world_size())
    model.enable_parallelism(config=config)  # installed after: our hook outside diffusers' sharding
    for name, kw in (("unscaled", {}), ("linear", linear)):
        handle = set_rope_processors(model, **kw)
        out[f"after {name}"] = float((run(model, inputs) - want[name]).abs().max())
        handle.remove()
    handle = set_rope_processors(model, mode="interpolate", train_size=(2, 3))
    try:
        run(model, inputs)
        out["mode"] = "ran"
    except ValueError as err:
        out["mode"] = str(err)
    handle.remove()
    out["removed"] = float((run(model, inputs) - stock).abs().max())  # diffusers' sharded stock model
    model, inputs = build()  # installed before: diffusers' sharding outside our hook
    handle = set_rope_processors(model, **linear)
    model.enable_parallelism(config=config)
    out["before linear"] = float((run(model, inputs) - want["linear"]).abs().max())
    return out


def test_the_adapter_under_diffusers_context_parallelism(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        for key in ("after unscaled", "after linear", "removed", "before linear"):
            assert out[key] < TOL, (rank, key, out[key])
        assert "context parallelism" in out["mode"] and "scaling=" in out["mode"], out["mode"]
