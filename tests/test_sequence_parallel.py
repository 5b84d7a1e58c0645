"""Sequence parallelism: sharded attention on 2, 3 and 4 gloo processes equals one process.

Each world size spawns its processes once and runs every case inside them: both methods,
both layouts, causal or not, lengths that divide by the ranks and lengths that do not,
raw q/k/v and the ``Attention`` layer with a video rope, with and without a text prefix.

The claim is equality, so it is checked in float64 (the ring accumulates in the input's
compute dtype): outputs and the gradients of q, k, v, of the layer's input and of its
parameters must match the single-process float64 result to ``TOL`` of the tensor's scale
(``max |a - b| <= TOL * max(1, max |b|)``). The bound behind ``TOL``: the two computations
differ only in summation order and in the online softmax's rescaling, each output a sum of
at most ``S + D < 64`` terms (parameter gradients: ``B S < 64`` token terms), so they differ
by at most about ``2 * 64 * u`` relative to the terms' scale, with float64's ``u = 1.1e-16``,
amplified by ``exp`` through the scores (``|score| < 10`` here, a factor ``< 10``):
``1.4e-13``; ``TOL = 1e-12`` holds on any CPU and thread count. (In float32 the same bound is
``1.5e-5``, above the 1e-6 this test once used: it failed on some CPUs.) Every rank must also
send exactly the bytes of ``communication_bytes``.
"""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import axial_rope as ar
from axial_rope.layers import Attention
from axial_rope.parallel import (
    ContextParallel,
    RankFailedError,
    communication_bytes,
    reset_sent_bytes,
    ring,
    sent_bytes,
    sequence_parallel_attention,
    split_groups,
)
from axial_rope.parallel.ring import block_pairs
from axial_rope.parallel.ulysses import ulysses_kv_heads

TOL = 1e-12  # float64 error bound (module docstring)
DTYPE = torch.float64
CASES = [(m, lay, c) for m in ("ring", "ulysses") for lay in ("contiguous", "zigzag") for c in (False, True)]


class Check:
    """Collects mismatches (never raises mid-collective, so no rank is left waiting) and the largest error."""

    def __init__(self):
        self.failures, self.max_err = [], 0.0

    def close(self, name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
        err = (actual - expected).abs().max().item() / max(1.0, expected.abs().max().item())
        self.max_err = max(self.max_err, err)
        if not err <= TOL:
            self.failures.append(f"{name}: error {err:.3g} of the tensor's scale")

    def equal(self, name: str, actual, expected) -> None:
        if actual != expected:
            self.failures.append(f"{name}: {actual} != {expected}")


def _function_case(check: Check, cp: ContextParallel, S: int, causal: bool) -> None:
    """Raw q/k/v (GQA: 12 query heads, 6 kv heads): output, gradients and bytes sent."""
    g = torch.Generator().manual_seed(S)
    q, k, v = (torch.randn(2, h, S, 8, generator=g, dtype=DTYPE).requires_grad_() for h in (12, 6, 6))
    w = torch.randn(2, 12, S, 8, generator=g, dtype=DTYPE)  # the loss' weights: a gradient that differs per element
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    cp = cp.for_length(S)
    local = [cp.shard(t.detach(), dim=2).requires_grad_() for t in (q, k, v)]
    valid, name = cp.valid(), f"{cp.method}/{cp.layout}/causal={causal}/S={S}"
    reset_sent_bytes()
    out = sequence_parallel_attention(*local, cp, causal=causal)
    (out * cp.shard(w, dim=2))[:, :, valid].sum().backward()  # padding kept out of the loss
    check.close(f"{name} out", out[:, :, valid], cp.shard(ref.detach(), 2)[:, :, valid])
    for t, full, label in zip(local, ref_grads, "qkv"):
        check.close(f"{name} d{label}", t.grad[:, :, valid], cp.shard(full, 2)[:, :, valid])
    expected = communication_bytes(
        cp.method, batch=2, seq_len=S, heads=12, kv_heads=6, head_dim=8, world=cp.world, layout=cp.layout,
        element_size=8, backward=True,
    )  # fmt: skip
    check.equal(f"{name} bytes sent", sent_bytes(), expected)


def _video_tokens(n_text: int):
    """A 2x3x4 latent of video tokens after ``n_text`` text tokens (Flux-style joint attention)."""
    image = ar.grid(2, 3, 4, offset=n_text)
    return torch.cat([ar.text_positions(n_text, 3), image]) if n_text else image


def _layer_case(check: Check, cp: ContextParallel, n_text: int, causal: bool) -> None:
    """``Attention(context_parallel=...)``: output (through ``gather``), input and parameter gradients."""
    torch.manual_seed(0)  # the same weights and data on every rank
    rope = ar.AxialRoPE((2, 4, 2), theta=64.0)
    attn = Attention(96, 12, rope, num_kv_heads=6, qk_norm="rms", causal=causal).to(DTYPE)
    pos = _video_tokens(n_text)
    S = pos.shape[0]
    x, w = torch.randn(2, S, 96, dtype=DTYPE, requires_grad=True), torch.randn(2, S, 96, dtype=DTYPE)
    ref = attn(x, pos)
    (ref * w).sum().backward()
    ref_grads = [p.grad.clone() for p in (x, *attn.parameters())]
    attn.zero_grad()
    cp = cp.for_length(S)
    x_local = cp.shard(x.detach()).requires_grad_()
    out = attn(x_local, cp.positions(pos), context_parallel=cp)
    (out * cp.shard(w))[:, cp.valid()].sum().backward()
    name = f"layer {cp.method}/{cp.layout}/causal={causal}/text={n_text}"
    check.close(f"{name} gathered out", cp.gather(out.detach()), ref.detach())
    full_x_grad = cp.gather(x_local.grad)  # each rank holds its own tokens' gradient
    grads = [full_x_grad] + [p.grad for p in attn.parameters()]
    for p in grads[1:]:
        dist.all_reduce(p, group=cp.group)  # parameter gradients: the ranks' shares summed
    check.close(f"{name} input grad", grads[0], ref_grads[0])
    for (param, _), got, want in zip(attn.named_parameters(), grads[1:], ref_grads[1:]):
        check.close(f"{name} grad {param}", got, want)


def _layout_case(check: Check, cp: ContextParallel, S: int) -> None:
    """Every global token on exactly one rank, padding only at the end."""
    slots = torch.cat([cp.indices(S, r) for r in range(cp.world)]).sort().values
    check.equal(f"{cp.layout} S={S} slots", slots.tolist(), list(range(cp.padded_len(S))))


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    torch.set_num_threads(1)
    ring.TILE = 5  # ring blocks in tiles of 5 x 5: chunks of 3 to 15 take 1 to 3 tiles a side
    check = Check()
    for method, layout, causal in CASES:
        cp = ContextParallel(None, method, layout)
        for S in (6 * world, 6 * world + 1):  # divisible by 2P (zigzag), and by no P here
            _layout_case(check, cp, S)
            _function_case(check, cp, S, causal)
        for n_text in (0, 5):  # 24 video tokens (divisible), 29 with the text (not divisible)
            _layer_case(check, cp, n_text, causal)
    try:  # world + 1 query heads never divide: every rank refuses before any collective
        q = torch.zeros(1, world + 1, 4, 8)
        sequence_parallel_attention(q, q, q, ContextParallel(None, "ulysses"))
        check.failures.append("Ulysses took heads that do not divide by the ranks")
    except ValueError as err:
        check.equal(
            "Ulysses error message", f"{world + 1} query heads do not divide by {world} ranks" in str(err), True
        )
    if world == 4:  # 2 x 2: two context groups of 2 ranks, each sharding its own sequence
        context_group, _ = split_groups(2)
        for method in ("ring", "ulysses"):
            _function_case(check, ContextParallel(context_group, method, "zigzag"), 13, True)
    Path(out_dir, f"{rank}.json").write_text(json.dumps({"failures": check.failures, "max_err": check.max_err}))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_sharded_attention_equals_one_process(tmp_path, world):
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    failures = [f"rank {r}: {f}" for r, res in enumerate(results) for f in res["failures"]]
    assert not failures, "\n".join(failures[:20])
    print(f"world {world}: largest error {max(res['max_err'] for res in results):.2e} of the scale")


def _disagreements(rank: int):
    """(field, what each rank's value must read as, this rank's call): calls that differ in one field.

    Unchecked, the length and dtype cases abort a process inside gloo, and the seq_len, layout,
    causal and scale cases return a wrong attention without an error."""
    q = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0))
    cp = ContextParallel(None, "ring").for_length(8)

    def attend(q, cp=cp, **kw):
        return lambda: sequence_parallel_attention(q, q, q, cp, **kw)

    first = rank == 0
    yield (
        "q.shape",
        ["(1, 2, 4, 8) on rank 0", "(1, 2, 5, 8) on rank 1"],
        attend(q if first else torch.zeros(1, 2, 5, 8), ContextParallel(None, "ring")),
    )
    yield "q.dtype", ["torch.float32 on rank 0", "torch.float64 on rank 1"], attend(q if first else q.double())
    yield "seq_len", ["8 on rank 0", "7 on rank 1"], attend(q, cp if first else cp.for_length(7))  # both L = 4
    zigzag = ContextParallel(None, "ring", "zigzag", seq_len=8)
    yield "layout", ["'contiguous' on rank 0", "'zigzag' on rank 1"], attend(q, cp if first else zigzag)
    ulysses = ContextParallel(None, "ulysses", seq_len=8)
    yield "method", ["'ring' on rank 0", "'ulysses' on rank 1"], attend(q, cp if first else ulysses)
    yield "causal", ["False on rank 0", "True on rank 1"], attend(q, causal=not first)
    yield "scale", ["None on rank 0", "0.5 on rank 1"], attend(q, scale=None if first else 0.5)
    yield (
        "x.shape",
        ["(1, 4, 3) on rank 0", "(1, 5, 3) on rank 1"],
        lambda: ContextParallel().gather(torch.zeros(1, 4 + rank, 3)),
    )
    gather = lambda: ContextParallel().gather(q)  # noqa: E731
    yield "call", ["'sequence_parallel_attention' on rank 0", "'cp.gather' on rank 1"], attend(q) if first else gather


def _consistency_worker(rank: int, init_file: str, out_dir: str) -> None:
    # a short timeout: a rank that hangs fails the test in seconds instead of gloo's 30 minutes
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timedelta(seconds=15)
    )
    torch.set_num_threads(1)
    result: dict = {"errors": {}, "failures": []}
    for field, values, call in _disagreements(rank):
        try:
            call()
            result["failures"].append(f"{field}: no error")
        except ValueError as err:
            result["errors"][field] = str(err)
            if not all(f"{field}: " in str(err) and v in str(err) for v in values):
                result["failures"].append(f"{field}: {err}")
    q = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0))
    ContextParallel().check_consistent(q, q, q)  # the group still works after the refusals
    sequence_parallel_attention(q, q, q, ContextParallel())
    # A rank that stays alive without making the call: the other's collective times out (2 s here)
    # and says that another rank failed.
    short = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    if rank == 0:
        try:
            sequence_parallel_attention(q, q, q, ContextParallel(short))
            result["failures"].append("a silent rank: no error")
        except RankFailedError as err:
            result["errors"]["silent rank"] = str(err)
    dist.barrier()
    # A rank that exits: the other's next collective says another rank failed.
    if rank == 1:
        Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
        os._exit(0)  # gone without a word, as a crashed process is
    try:
        sequence_parallel_attention(q, q, q, ContextParallel())
        result["failures"].append("an exited rank: no error")
    except RankFailedError as err:
        result["errors"]["exited rank"] = str(err)
    Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    # out without running the broken group's destructors, which may abort the process (std::terminate from a
    # gloo thread still waiting on the exited peer) after the results are written
    os._exit(0)


def test_ranks_that_disagree_all_raise_the_same_error_naming_the_field(tmp_path):
    mp.spawn(_consistency_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert not results[0]["failures"] + results[1]["failures"], results
    for field, message in results[0]["errors"].items():
        if field in ("silent rank", "exited rank"):
            assert "another rank of the process group failed" in message, message
            assert "timeout=timedelta" in message
        else:
            assert results[1]["errors"][field] == message  # the same error on every rank
            assert message.startswith("the 2 ranks of the context-parallel group disagree")
    assert {"silent rank", "exited rank"} <= results[0]["errors"].keys()
    assert "Timed out" in results[0]["errors"]["silent rank"]


# -- one process: no process group needed --------------------------------------------------


@pytest.mark.parametrize("method, layout, causal", CASES)
@pytest.mark.parametrize("tile", [1024, 3])
def test_one_rank_equals_sdpa(monkeypatch, method, layout, causal, tile):
    monkeypatch.setattr(ring, "TILE", tile)
    cp = ContextParallel(method=method, layout=layout)
    check = Check()
    _function_case(check, cp, 7, causal)  # zigzag pads 7 to 8 even on one rank
    _function_case(check, cp, 16, causal)
    assert not check.failures, check.failures


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    def work(ids_of, P, S, causal=True):  # score entries each rank computes over the whole ring
        c = S // (P * len(ids_of(0)))
        return [
            sum(
                c * n * (0.5 if diag else 1.0)
                for src in range(P)
                for _, _, n, diag in block_pairs(ids_of(r), ids_of(src), c, S, causal)
            )
            for r in range(P)
        ]

    for P in (2, 3, 4):
        zigzag = work(lambda r, P=P: (r, 2 * P - 1 - r), P, 8 * P)
        contiguous = work(lambda r: (r,), P, 8 * P)
        assert len(set(zigzag)) == 1 and sum(zigzag) == sum(contiguous)
        assert contiguous == sorted(contiguous) and contiguous[-1] == (2 * P - 1) * contiguous[0]
        assert sum(work(lambda r: (r,), P, 8 * P, causal=False)) == (8 * P) ** 2


def test_ulysses_heads_must_divide_and_kv_heads_are_repeated_as_little_as_possible():
    with pytest.raises(ValueError, match="6 query heads do not divide by 4 ranks"):
        ulysses_kv_heads(6, 2, 4)
    assert ulysses_kv_heads(12, 6, 4) == 12  # 6 kv heads repeated twice
    assert ulysses_kv_heads(16, 2, 4) == 4  # 2 repeated twice, not to 16
    assert ulysses_kv_heads(8, 8, 4) == 8


def test_attention_refuses_what_context_parallel_cannot_take():
    rope = ar.AxialRoPE(8, scaling=ar.scaling.DynamicNTK(2.0, 16))
    attn = Attention(16, 2, rope, causal=True)
    x, pos, cp = torch.randn(1, 4, 16, dtype=DTYPE), torch.arange(4), ContextParallel()
    attn = attn.to(DTYPE)
    with pytest.raises(ValueError, match="length-dependent"):
        attn(x, pos, context_parallel=cp)
    with pytest.raises(ValueError, match="no mask"):
        attn(x, pos, mask=torch.ones(4, 4, dtype=torch.bool), seq_len=4, context_parallel=cp)
    with pytest.raises(ValueError, match="KV cache"):
        attn(x, pos, cache=ar.KVCache(1, 8, 2, 8), input_pos=pos, seq_len=4, context_parallel=cp)
    with pytest.raises(ValueError, match="tokens per rank"):
        attn(x, pos, seq_len=4, context_parallel=cp.for_length(5))
    with pytest.raises(ValueError, match="method must be one of"):
        ContextParallel(method="tree")
    torch.testing.assert_close(attn(x, pos, seq_len=4, context_parallel=cp), attn(x, pos, seq_len=4), atol=TOL, rtol=0)


def test_distributed_page_examples_run_on_one_rank():
    page = Path(__file__).resolve().parents[1] / "docs" / "distributed.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:  # one reader's session: the second block uses the first one's names
        exec(compile(block, "docs/distributed.md:example", "exec"), namespace)
