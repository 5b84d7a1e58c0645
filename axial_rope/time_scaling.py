"""Scaling methods whose frequencies follow the sampling time of a diffusion model (DyPE, Lumina-Next).

Time convention: ``t`` is the **noise level** in ``[0, 1]``: ``t = 1`` is pure noise (the first
sampling step), ``t = 0`` the clean sample, as in rectified flow and the ``sigmas`` of diffusers'
flow-match schedulers (``x_t = (1 - t) x_0 + t eps``). A model timestep in ``[0, 1000]`` is ``1000 t``.
Lumina-Next counts the other way (its ``t = 1 - sigma``); :class:`TimeAwareNTK` converts.

``t`` is a python float, a 0-d tensor or a ``[B]`` tensor whose entries are equal (a sampler's
batch shares the step's time): one ``F`` per call, which every backend takes. The frequencies are
torch ops on ``t`` (no ``.item()``, no python branch on its value), so a model compiled with ``t``
as a tensor input compiles once and runs every step without recompiling.

The methods are frozen dataclasses in :data:`axial_rope.scaling.REGISTRY` (``to_dict`` / ``from_dict``
as every method). Their ``__call__(dim, theta, seq_len)`` refuses to guess a time: use
:func:`inv_freq_at`, ``AxialRoPE(..., scaling=...)(q, k, pos, t=t)`` or ``rope.at_time(t)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .ops import has_float64
from .scaling import Scaling, base_inv_freq, inv_freq, yarn_mscale, yarn_pair_index, yarn_ramp
from .scaling_checks import check_theta_above_one

__all__ = [
    "DyPE",
    "TimeAwareNTK",
    "TimeDependent",
    "DYPE_METHODS",
    "inv_freq_at",
    "is_time_dependent",
    "sampling_time",
    "time_of_call",
]

DYPE_METHODS = ("yarn", "ntk", "linear")

_T_RANGE = (
    "t must be the noise level in [0, 1] (1 = pure noise, the first sampling step; 0 = clean); "
    "a model timestep in [0, 1000] is 1000 t"
)


def sampling_time(t, device=None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` (a number, a 0-d tensor, or ``[B]`` equal entries) as a 0-d tensor on ``device``, float64 (``dtype``:
    another, float32 on a device without float64).

    Checked to lie in ``[0, 1]`` (and, for ``[B]``, to hold one value): eagerly on CPU tensors and
    numbers (``ValueError``), with ``torch._assert_async`` otherwise (compiled code, GPU: no host sync).
    Under ``torch.compile`` a Python number is refused (``TypeError``): it would be a constant of the
    compiled graph, so every sampling step would compile again.
    """
    if isinstance(t, bool) or not isinstance(t, (int, float, torch.Tensor)):
        raise TypeError(f"t must be a number or a tensor (the noise level in [0, 1]), got {t!r}")
    if not isinstance(t, torch.Tensor) and torch.compiler.is_compiling():
        _refuse_while_tracing(
            f"t must be a tensor under torch.compile, got the number {t!r}: a Python number is a constant of the "
            "compiled graph, so each new sampling time would recompile; pass torch.tensor(t)"
        )
    if not isinstance(t, torch.Tensor):
        if not (math.isfinite(t) and 0 <= t <= 1):
            raise ValueError(f"{_T_RANGE}; got {t!r}")
        return torch.tensor(float(t), dtype=dtype or _dtype(device), device=device)
    if t.ndim > 1 or t.numel() == 0 or not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"t must be a 0-d or [B] real tensor (one time per call), got {t.dtype} {tuple(t.shape)}")
    device = device if device is not None else t.device
    flat = t.detach().reshape(-1).to(device=device, dtype=dtype or _dtype(device))
    first = flat[0]
    in_range, shared = ((flat >= 0) & (flat <= 1)).all(), (flat == first).all()
    if flat.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(in_range):
            raise ValueError(f"{_T_RANGE}; got {t.tolist()}")
        if not bool(shared):
            raise ValueError(f"t must hold one time per call (a [B] t with equal entries), got {t.tolist()}")
    else:
        torch._assert_async(in_range & shared, "axial_rope: t must be one noise level in [0, 1] per call")
    return first


@torch.compiler.assume_constant_result
def _refuse_while_tracing(message: str) -> None:
    """Raise ``TypeError(message)`` from inside a ``torch.compile`` trace, with or without ``fullgraph``.

    A ``raise`` in traced code does not reach the caller: dynamo reports it as its own "Observed exception"
    (``fullgraph=True``) or runs the function again eagerly, where ``is_compiling()`` is False and nothing is
    refused. A function marked ``assume_constant_result`` runs while dynamo traces, and an exception of the kinds
    dynamo passes on (here ``torch._dynamo.exc.TorchRuntimeError``) reaches the caller unchanged in both modes.
    """
    from torch._dynamo.exc import TorchRuntimeError  # imported: this only runs while dynamo traces

    class CompiledTimeError(TorchRuntimeError, TypeError):
        """A TypeError that dynamo passes on from its trace (it is also its TorchRuntimeError)."""

    raise CompiledTimeError(message)


def _dtype(device) -> torch.dtype:
    """float64, or float32 on a device without it."""
    return torch.float64 if device is None or has_float64(device) else torch.float32


def _base(dim: int, theta: float, device, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f0, e)``: the unscaled spectrum ``theta ** -e`` and exponents ``e_j = 2j / dim``, ``[dim // 2]`` in ``dtype``."""
    base_inv_freq(dim, theta)  # validates dim and theta with the library's messages
    exponent = torch.arange(0, dim, 2, dtype=dtype, device=device) / dim  # made on t's device: no copy
    return 1.0 / (float(theta) ** exponent), exponent


class TimeDependent:
    """Mixin of the time-dependent methods (not a :class:`~axial_rope.scaling.Scaling` itself, so not registered).

    A method implements :meth:`inv_freq_at` (torch ops on ``t``) and :meth:`attention_scale`
    (a python float: constant in time, so attention code reads it without a host sync).
    """

    time_dependent: ClassVar[bool] = True

    def inv_freq_at(self, dim: int, theta: float, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attention_scale(self) -> float:
        return 1.0

    def __call__(self, dim: int, theta: float, seq_len: int | None):
        name = type(self).__name__
        raise TypeError(
            f"{name} depends on the sampling time t: use axial_rope.time_scaling.inv_freq_at(dim, theta, method, t), "
            f"rope(q, k, pos, t=t) or rope.at_time(t) (t = noise level in [0, 1]), not inv_freq(dim, theta, method)"
        )


def is_time_dependent(method) -> bool:
    return bool(getattr(method, "time_dependent", False))


def time_of_call(t, methods, device, dtype=torch.float64) -> torch.Tensor:
    """A time-dependent rope's ``t`` as a 0-d ``dtype`` tensor on ``device`` (checked by :func:`sampling_time`; the
    error names the methods that need it)."""
    if t is None:
        names = sorted({type(m).__name__ for m in methods if is_time_dependent(m)})
        raise ValueError(
            f"this rope's scaling ({', '.join(names)}) depends on the sampling time: pass t= (the noise "
            "level in [0, 1], 1 = pure noise) to the call, or rotate with rope.at_time(t)"
        )
    return sampling_time(t, device, dtype)


@dataclass(frozen=True)
class DyPE(TimeDependent, Scaling):
    """Dynamic Position Extrapolation (Issachar et al. 2025, arXiv:2510.20766): a scaling that relaxes with time.

    The schedule is ``kappa(t) = lambda_s * t ** lambda_t``: ``lambda_s`` at the first step (``t = 1``),
    1 at ``t = lambda_s ** (-1 / lambda_t)``, 0 at the end. With ``s = factor``, ``L =
    original_max_position_embeddings``, ``f0_j = theta ** (-2j / d)`` on an axis of ``d`` channels:

    - ``method="linear"`` (Dy-PI): ``f_j = f0_j / s ** kappa(t)``;
    - ``method="ntk"`` (Dy-NTK): base ``theta * s ** (kappa(t) d / (d - 2))`` (``exponent=False``:
      ``theta * s ** kappa(t)``), i.e. the NTK factor raised to ``kappa(t)``, as the authors' code
      (``guyyariv/DyPE``, ``flux/transformer_flux.py``: ``base_ntk ** (2.0 * t ** 2.0)``);
    - ``method="yarn"`` (Dy-YaRN, the default): :class:`~axial_rope.scaling.YaRN` with its ramp
      thresholds modulated, ``beta_fast * kappa(t)`` and ``beta_slow * kappa(t)`` turns over ``L``
      (the ramp moves by ``-d ln kappa / (2 ln theta)`` pairs), ``s`` and the attention factor fixed,
      as the authors' code scales its thresholds (``beta_0 * kappa``; there ``kappa = t ** 2``, i.e.
      ``lambda_s = 1``). The low end is also clipped to ``d - 1`` so ``kappa -> 0`` extrapolates every pair.

    Every method equals its static counterpart at ``kappa(t) = 1`` and is unscaled at ``t = 0``
    (frequencies ``f0``; YaRN keeps its attention factor ``0.1 ln s + 1`` or ``attention_factor``).
    Where implementations differ: ComfyUI-DyPE and InvokeAI raise a two-ramp "vision YaRN"'s
    constants to the power ``kappa`` (``beta ** kappa``); here the paper's ``kappa(t)`` multiplies
    this library's (transformers') one-ramp YaRN thresholds. ``beta_*``, ``truncate`` and
    ``attention_factor`` apply to ``yarn`` only, ``exponent`` to ``ntk`` only.
    """

    rope_type = "dype"
    factor_below_one = "error"

    factor: float
    original_max_position_embeddings: int
    method: str = "yarn"
    lambda_s: float = 2.0
    lambda_t: float = 2.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True
    exponent: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.method not in DYPE_METHODS:
            raise ValueError(f"DyPE: method must be one of {DYPE_METHODS}, got {self.method!r}")
        if self.beta_fast < self.beta_slow:
            raise ValueError(f"DyPE: beta_fast ({self.beta_fast}) must be >= beta_slow ({self.beta_slow})")
        defaults = {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "truncate": True}
        unused = [k for k, v in defaults.items() if self.method != "yarn" and getattr(self, k) != v]
        unused += ["exponent"] if self.method != "ntk" and not self.exponent else []
        if unused:
            raise ValueError(f"DyPE: {unused} do(es) not apply to method={self.method!r}")

    def kappa(self, t: torch.Tensor) -> torch.Tensor:
        """``lambda_s * t ** lambda_t`` (0-d float64, 0 at ``t = 0``)."""
        return self.lambda_s * t**self.lambda_t

    def attention_scale(self) -> float:
        if self.method != "yarn":
            return 1.0
        return float(self.attention_factor) if self.attention_factor is not None else yarn_mscale(self.factor)

    def inv_freq_at(self, dim: int, theta: float, t: torch.Tensor) -> torch.Tensor:
        f0, exponent = _base(dim, theta, t.device, t.dtype)
        kappa = self.kappa(t)
        if self.method == "linear":
            return f0 / self.factor**kappa
        if self.method == "ntk":
            check_theta_above_one("DyPE", theta, "NTK grows the base")
            if self.exponent and dim <= 2:
                raise ValueError(f"DyPE: dim must be > 2 for the d/(d-2) exponent, got {dim}")
            growth = dim / (dim - 2) if self.exponent else 1.0
            return 1.0 / ((theta * self.factor ** (kappa * growth)) ** exponent)
        return self._yarn(dim, theta, f0, kappa)

    def _yarn(self, dim: int, theta: float, f0: torch.Tensor, kappa: torch.Tensor) -> torch.Tensor:
        """YaRN's ramp (as :class:`~axial_rope.scaling.YaRN`) with both thresholds times ``kappa``; ``[dim // 2]``."""
        check_theta_above_one("DyPE", theta, "the ramp divides by log(theta)")
        length = self.original_max_position_embeddings
        shift = -dim * torch.log(kappa) / (2 * math.log(theta))  # [] pairs: -0.0 at kappa = 1, +inf at kappa = 0
        low = yarn_pair_index(self.beta_fast, dim, theta, length) + shift
        high = yarn_pair_index(self.beta_slow, dim, theta, length) + shift
        if self.truncate:
            low, high = low.floor(), high.ceil()
        low, high = low.clamp(0, dim - 1), high.clamp(max=dim - 1)  # inf -> d - 1: no NaN at kappa = 0
        return yarn_ramp(f0, self.factor, low, high)


@dataclass(frozen=True)
class TimeAwareNTK(TimeDependent, Scaling):
    """Lumina-Next's time-aware scaled RoPE (Zhuo et al. 2024, arXiv:2406.18583, Sec. 2.3).

    With ``tau = 1 - t`` (Lumina's time: 0 = noise, 1 = clean), ``s = factor``, ``D = head_dim``
    (``None``: the axis' width ``d``) and ``f0_j = theta ** (-2j / d)``:

    ``f_j = max(f0_j / s, (theta * s ** (D / (tau D + 1))) ** (-2j / d))``

    as ``NextDiT.precompute_freqs_cis`` in ``Alpha-VLLM/Lumina-T2X``
    (``lumina_next_t2i/models/model.py``; there ``D`` is the head dim, twice the axis width of its
    2-D RoPE: pass ``head_dim`` to reproduce it). At ``t = 1`` the base grows by ``s ** D``, so the
    maximum is position interpolation (``f0 / s``) but for the highest frequency; at ``t = 0`` it is
    NTK-like (base ``theta * s ** (D / (D + 1))``). ``watershed`` instead switches, as diffusers'
    ``LuminaText2ImgPipeline`` (``scaling_watershed``): ``f0 / s`` while ``tau < watershed``, then
    ``theta * s`` (:class:`~axial_rope.scaling.NTK` without the exponent). Attention factor 1.
    """

    rope_type = "time_aware_ntk"
    factor_below_one = "error"

    factor: float
    head_dim: int | None = None
    watershed: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.watershed is not None and not 0 < self.watershed <= 1:  # a fraction of Lumina's time tau in [0, 1]
            raise ValueError(f"TimeAwareNTK: watershed must be in (0, 1] (Lumina's time 1 - t), got {self.watershed!r}")

    def inv_freq_at(self, dim: int, theta: float, t: torch.Tensor) -> torch.Tensor:
        check_theta_above_one("TimeAwareNTK", theta, "NTK grows the base")
        f0, exponent = _base(dim, theta, t.device, t.dtype)
        tau, interpolated = 1 - t, f0 / self.factor
        if self.watershed is not None:
            ntk = 1.0 / ((theta * self.factor) ** exponent)
            return torch.where(tau < self.watershed, interpolated, ntk)
        width = self.head_dim if self.head_dim is not None else dim
        grown = theta * self.factor ** (width / (tau * width + 1))  # [] base at tau
        return torch.maximum(interpolated, 1.0 / (grown**exponent))


def inv_freq_at(dim: int, theta: float, scaling: Scaling | None, t) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of one axis at time ``t``: float64 ``[dim // 2]`` (on ``t``'s device) and the factor.

    A time-independent ``scaling`` (or ``None``) gives :func:`~axial_rope.scaling.inv_freq`'s result,
    so callers need not tell the kinds apart.
    """
    device = t.device if isinstance(t, torch.Tensor) else None
    if not is_time_dependent(scaling):
        inv, factor = inv_freq(dim, theta, scaling)
        return inv.to(device) if device is not None else inv, factor
    return scaling.inv_freq_at(dim, float(theta), sampling_time(t, device)), scaling.attention_scale()
