"""What a planned length does to attention, measured on a model's own (unrotated) q and k.

Two quantities for the extrapolation map (:mod:`axial_rope.doctor.extrapolation`) of a one-axis model:

- **attention entropy**: a query at the last position attends (causally) to keys at every earlier position, each
  key a vector drawn from the captured ones (with replacement, seeded), rotated at its position by each
  method's rope. The mean entropy over queries and heads at the planned length minus that at the trained
  length (unscaled) is the change; uniform attention would gain ``log(M / N)``. Keys past 2048 positions are
  taken at evenly spaced positions and the entropy corrected by ``log(stride)`` (attention weights that vary
  slowly with distance: the sum over a stride of keys is the stride times the one taken).
- **phase concentration against the sinks** (streaming with sink tokens kept at the start): LoL (Cui et al.,
  arXiv:2601.16914) traces sink collapse to the planes of many heads realigning with the sink frames at once.
  The doctor's measure of it, per head ``h`` at distance ``d`` from the sinks, is the weighted mean resultant
  length of the planes' relative turns, ``C_h(d) = |sum_j w_hj exp(i F_j d)| / sum_j w_hj``, with ``w_hj`` the
  plane's mean magnitude in q times that in k (the planes that carry the head's logits): 1 at ``d = 0`` and
  wherever every weighted plane has turned a whole number of times. Its peaks beyond the trained extent, and
  how many heads peak together, are what the map reports; this is the doctor's definition, not LoL's code.
"""

from __future__ import annotations

import math

import torch

from ..frequencies import Frequencies
from ..rope import AxialRoPE

__all__ = ["entropy_changes", "sink_concentration"]

KEYS = 2048  # key positions per query, at most
QUERIES = 8  # queries per head
HEADS = 4  # heads measured, at most


def _tokens(sample) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = sample
    return q.detach().float().flatten(0, 1), k.detach().float().flatten(0, 1)  # [T, H, D], [T, H_k, D]


def _entropy(rope: AxialRoPE, q, k, length: int, step: float, divisor: float, gen) -> float:
    """Mean attention entropy (nats) of queries at position ``length - 1`` over keys at ``0 .. length - 1``."""
    positions = torch.unique(torch.linspace(0, length - 1, min(length, KEYS)).round())  # [K]
    stride = length / positions.numel()
    heads = min(q.shape[1], HEADS)
    group = q.shape[1] // k.shape[1]
    keys = k[torch.randint(0, k.shape[0], (positions.numel(),), generator=gen)]  # [K, H_k, D]
    queries = q[torch.randint(0, q.shape[0], (QUERIES,), generator=gen)]  # [Q, H, D]
    pos_k = (positions * step / divisor)[:, None].double()
    pos_q = torch.full((QUERIES, 1), (length - 1) * step / divisor, dtype=torch.float64)
    k_rot = rope.rotate(keys[None], pos_k, layout="bshd")[0]  # [K, H_k, D]
    q_rot = rope.rotate(queries[None], pos_q, layout="bshd")[0]  # [Q, H, D]
    total = 0.0
    for h in range(heads):
        logits = q_rot[:, h] @ k_rot[:, h // group].T / math.sqrt(q.shape[-1])  # [Q, K]
        p = logits.double().softmax(-1)
        total += float(-(p * p.clamp_min(1e-300).log()).sum(-1).mean()) + math.log(stride)
    return total / heads


def entropy_changes(rope: AxialRoPE, sample, methods: dict, axis: int, trained: int, planned: int, step: float):
    """Per method (:class:`~axial_rope.doctor.extrapolation.Method`), the mean attention entropy at ``planned``
    minus the one at ``trained`` with the unscaled spectrum (nats)."""
    if rope.n_axes != 1:
        return None
    q, k = _tokens(sample)

    def rope_of(freqs, scale) -> AxialRoPE:
        factor = None if scale is None or bool((scale == 1).all()) else scale
        return AxialRoPE.from_frequencies(Frequencies(freqs, factor), pairing=rope.pairing)

    out, reference = {}, None
    for name, method in methods.items():
        if method.freqs is None:
            continue
        if reference is None:  # the first method is the unscaled one: its entropy at the trained length
            reference = _entropy(
                rope_of(method.freqs, None), q, k, trained, step, 1.0, torch.Generator().manual_seed(0)
            )
        scaled = rope_of(method.freqs, method.scale)
        gen = torch.Generator().manual_seed(0)
        out[name] = _entropy(scaled, q, k, planned, step, method.divisors.get(axis, 1.0), gen) - reference
    return out


def sink_concentration(rope: AxialRoPE, sample, axis: int, trained: int, planned: int, step: float, sinks: int):
    """The heads' phase concentration against the sink tokens (module docstring), beyond and within training."""
    q, k = _tokens(sample)
    n = rope.n_pairs
    freqs = rope.frequencies()[0][axis]  # [n]
    on_axis = freqs != 0

    def magnitude(x):  # [T, H, D] -> mean plane magnitude [H, n]
        if rope.pairing == "interleaved":
            re, im = x[..., 0 : 2 * n : 2], x[..., 1 : 2 * n : 2]
        else:
            re, im = x[..., :n], x[..., n : 2 * n]
        return torch.sqrt(re.double() ** 2 + im.double() ** 2).mean(0)

    group = q.shape[1] // k.shape[1]
    weights = magnitude(q) * magnitude(k).repeat_interleave(group, 0) * on_axis  # [H, n]
    distances = torch.unique(torch.linspace(1, planned, min(planned, 4 * KEYS)).round()).double()  # [L]
    angle = distances[:, None] * step * freqs[None]  # [L, n]
    turns = torch.polar(torch.ones_like(angle), angle)
    conc = (turns[None] * weights[:, None]).sum(-1).abs() / weights.sum(-1, keepdim=True)  # [H, L]
    mean = conc.mean(0)
    beyond = distances > trained
    within = (distances >= trained / 2) & ~beyond
    if not beyond.any():
        return None
    peak = int(torch.argmax(torch.where(beyond, mean, -1.0)))
    reference = float(mean[within].max()) if within.any() else float("nan")
    per_head = torch.where(beyond[None], conc, -1.0).amax(-1)
    return {"sinks": sinks, "peak_mean": float(mean[peak]), "peak_distance": int(distances[peak]),
            "trained_mean": reference, "per_head_peak": [float(v) for v in per_head],
            "heads_above_trained": int((conc[:, peak] > reference).sum())}  # fmt: skip
