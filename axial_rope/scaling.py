"""Frequency schedules of one rotary axis: the base spectrum and its scaling methods.

Every function here returns ``(inv_freq, attention_factor)``: a float64 tensor of
``dim // 2`` inverse frequencies (radians per unit of position) and a python float
that multiplies cos and sin (so attention logits scale by its square). ``dim`` is
the rotary width of the axis, so each axis of an :class:`~axial_rope.AxialRoPE`
uses its own width in every exponent.

The methods are frozen dataclasses whose field names follow the keys of
transformers' ``rope_parameters``, so a config converts one-to-one; the rules
follow ``transformers.modeling_rope_utils`` (checked in ``tests/test_scaling.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

import torch

__all__ = [
    "Linear",
    "NTK",
    "DynamicNTK",
    "YaRN",
    "Llama3",
    "LongRoPE",
    "RIFLEx",
    "Scaling",
    "REGISTRY",
    "from_dict",
    "base_inv_freq",
    "inv_freq",
    "from_rope_parameters",
]


def _check_positive(owner: str, name: str, value: float, *, strict: bool = True) -> None:
    bad = not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
    if bad or (value <= 0 if strict else value < 0):
        need = "a finite number > 0" if strict else "a finite number >= 0"
        raise ValueError(f"{owner}: {name} must be {need}, got {value!r}")


def _check_fields_positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None:
            _check_positive(type(obj).__name__, name, value)


class Scaling:
    """Base of the scaling methods: frozen dataclasses that map ``(dim, theta, seq_len)`` to ``(inv_freq, factor)``.

    ``rope_type`` names the method in configs (transformers' name where it has one);
    ``length_dependent`` says whether the frequencies depend on the length processed.
    Subclasses register themselves in :data:`REGISTRY` under their ``rope_type``.
    """

    rope_type: ClassVar[str]
    length_dependent: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        REGISTRY[cls.rope_type] = cls

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        raise NotImplementedError

    def to_dict(self) -> dict:
        """JSON-able ``{"rope_type": ..., field: value, ...}`` (tuples as lists); :func:`from_dict` inverts it."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"rope_type": self.rope_type} | {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


REGISTRY: dict[str, type[Scaling]] = {}


def from_dict(config: dict) -> Scaling:
    """The scaling method a :meth:`Scaling.to_dict` dict describes."""
    if not isinstance(config, dict) or config.get("rope_type") not in REGISTRY:
        raise ValueError(f"a scaling dict needs 'rope_type' in {sorted(REGISTRY)}, got {config!r}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k != "rope_type"}
    return REGISTRY[config["rope_type"]](**kwargs)


def base_inv_freq(dim: int, theta: float = 10000.0) -> torch.Tensor:
    """The unscaled RoPE spectrum ``theta ** (-2j / dim)`` for ``j < dim // 2``, float64 ``[dim // 2]``."""
    if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even int, got {dim!r}")
    _check_positive("inv_freq", "theta", theta)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim  # cpu: also under a meta default
    return 1.0 / (float(theta) ** exponent)


@dataclass(frozen=True)
class Linear(Scaling):
    """Position interpolation (Chen et al. 2023): every frequency divided by ``factor``."""

    rope_type = "linear"

    factor: float

    def __post_init__(self):
        _check_fields_positive(self, "factor")

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        return base_inv_freq(dim, theta) / self.factor, 1.0


@dataclass(frozen=True)
class NTK(Scaling):
    """NTK-aware base scaling: ``theta * factor ** (dim / (dim - 2))`` (transformers, FiT).

    ``exponent=False`` gives the plain ``theta * factor`` that diffusers (Lumina) calls NTK.
    """

    rope_type = "ntk"

    factor: float
    exponent: bool = True

    def __post_init__(self):
        _check_fields_positive(self, "factor")

    def scaled_theta(self, dim: int, theta: float) -> float:
        if not self.exponent:
            return theta * self.factor
        if dim <= 2:
            raise ValueError(f"NTK: dim must be > 2 for the d/(d-2) exponent, got {dim}")
        return theta * self.factor ** (dim / (dim - 2))

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        return base_inv_freq(dim, self.scaled_theta(dim, theta)), 1.0


@dataclass(frozen=True)
class DynamicNTK(Scaling):
    """Dynamic NTK (transformers' ``dynamic``): the base grows with the length seen.

    At ``seq_len <= max_position_embeddings`` (or ``None``) the spectrum is unscaled;
    beyond, ``theta * (factor * L / L_max - (factor - 1)) ** (dim / (dim - 2))``.
    """

    rope_type = "dynamic"
    length_dependent = True

    factor: float
    max_position_embeddings: int

    def __post_init__(self):
        _check_fields_positive(self, "factor", "max_position_embeddings")

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        max_len = self.max_position_embeddings
        length = max_len if seq_len is None else max(seq_len, max_len)
        growth = self.factor * length / max_len - (self.factor - 1)
        if dim <= 2:
            raise ValueError(f"DynamicNTK: dim must be > 2 for the d/(d-2) exponent, got {dim}")
        return base_inv_freq(dim, theta * growth ** (dim / (dim - 2))), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YaRN(Scaling):
    """YaRN (Peng et al. 2023) with transformers' rules.

    High frequencies (more than ``beta_fast`` turns over the original length) keep
    their value, low ones (fewer than ``beta_slow`` turns) are interpolated by
    ``factor``; between, a ramp that is linear in the pair index. The correction
    range is floored/ceiled when ``truncate``. The attention factor is
    ``attention_factor`` if given, else ``mscale(factor, mscale) / mscale(factor,
    mscale_all_dim)`` when both are set, else ``0.1 ln(factor) + 1``.
    """

    rope_type = "yarn"

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        _check_fields_positive(
            self, "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"
        )

    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
        return _yarn_mscale(self.factor)

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        original = self.original_max_position_embeddings

        def pair_index(turns: float) -> float:
            # the (fractional) pair whose wavelength fits `turns` times into the original length
            return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

        low, high = pair_index(self.beta_fast), pair_index(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # avoids a zero-width ramp, as transformers does
        ramp = ((torch.arange(dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
        base = base_inv_freq(dim, theta)
        # ramp 0: keep (extrapolate); ramp 1: interpolate by factor
        inv = base / self.factor * ramp + base * (1 - ramp)
        return inv, self.attention_scale()


@dataclass(frozen=True)
class Llama3(Scaling):
    """Llama 3.1's frequency-dependent interpolation.

    Wavelengths shorter than ``L / high_freq_factor`` are kept, longer than
    ``L / low_freq_factor`` divided by ``factor``, with a smooth blend between
    (``L = original_max_position_embeddings``).
    """

    rope_type = "llama3"

    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self):
        _check_fields_positive(
            self, "factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"
        )
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"Llama3: high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor ({self.low_freq_factor})"
            )

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        base = base_inv_freq(dim, theta)
        length = self.original_max_position_embeddings
        wavelen = 2 * math.pi / base
        smooth = ((length / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)).clamp(
            0, 1
        )
        # smooth is 0 for wavelengths > L / low_freq_factor, 1 for those < L / high_freq_factor
        inv = (1 - smooth) * base / self.factor + smooth * base
        return inv, 1.0


@dataclass(frozen=True)
class LongRoPE(Scaling):
    """LongRoPE (Phi-3): per-pair rescale factors, ``short_factor`` up to the original length, ``long_factor`` beyond.

    The attention factor is ``attention_factor`` if given, else
    ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` for ``factor > 1``
    (``factor=None`` means 1: no attention scaling).
    """

    rope_type = "longrope"
    length_dependent = True

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float | None = None
    attention_factor: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "short_factor", tuple(float(f) for f in self.short_factor))
        object.__setattr__(self, "long_factor", tuple(float(f) for f in self.long_factor))
        for name in ("short_factor", "long_factor"):
            for value in getattr(self, name):
                _check_positive("LongRoPE", f"every entry of {name}", value)
        _check_fields_positive(self, "original_max_position_embeddings", "factor", "attention_factor")

    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.factor is None or self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings))

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        long = seq_len is not None and seq_len > self.original_max_position_embeddings
        name = "long_factor" if long else "short_factor"
        rescale = getattr(self, name)
        if len(rescale) != dim // 2:
            raise ValueError(f"LongRoPE: {name} has {len(rescale)} entries, the axis has dim // 2 = {dim // 2} pairs")
        return base_inv_freq(dim, theta) / torch.tensor(
            rescale, dtype=torch.float64, device="cpu"
        ), self.attention_scale()


@dataclass(frozen=True)
class RIFLEx(Scaling):
    """RIFLEx (Zhao et al. 2025): the intrinsic frequency, pair ``k - 1``, gets ``0.9 * 2 pi / test_length``.

    Used on the temporal axis of a video model so that pair completes less than
    one period over the ``test_length`` frames (latent frames) generated.
    """

    rope_type = "riflex"

    k: int
    test_length: int

    def __post_init__(self):
        _check_fields_positive(self, "k", "test_length")
        if not isinstance(self.k, int):
            raise TypeError(f"RIFLEx: k must be an int (1-based pair index), got {self.k!r}")

    @staticmethod
    def intrinsic_k(dim: int, theta: float, train_length: int) -> int:
        """The pair (1-based) whose period is closest to ``train_length``: the one RIFLEx reins in."""
        periods = 2 * math.pi / base_inv_freq(dim, theta)
        return int((periods - train_length).abs().argmin()) + 1

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        inv = base_inv_freq(dim, theta)
        if self.k > dim // 2:
            raise ValueError(f"RIFLEx: k={self.k} exceeds the axis' {dim // 2} pairs")
        inv[self.k - 1] = 0.9 * 2 * math.pi / self.test_length
        return inv, 1.0



def inv_freq(
    dim: int, theta: float = 10000.0, scaling: Scaling | None = None, *, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of one rotary axis.

    Args:
        dim: rotary width of the axis (even); the spectrum has ``dim // 2`` pairs.
        theta: the base (``rope_theta``).
        scaling: one of the methods of :mod:`axial_rope.scaling`, or ``None``.
        seq_len: the length being processed, used by :class:`DynamicNTK` and
            :class:`LongRoPE` only.

    Returns:
        ``(inv_freq, attention_factor)``: float64 ``[dim // 2]`` and a python float.
    """
    if scaling is None:
        return base_inv_freq(dim, theta), 1.0
    if not isinstance(scaling, Scaling):
        names = ", ".join(m.__name__ for m in REGISTRY.values())
        raise TypeError(f"scaling must be None or one of axial_rope.scaling.{{{names}}}, got {scaling!r}")
    base_inv_freq(dim, theta)  # validates dim and theta with a clear message
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len <= 0):
        raise ValueError(f"seq_len must be a positive int or None, got {seq_len!r}")
    inv, factor = scaling(dim, float(theta), seq_len)
    return inv, float(factor)


def from_rope_parameters(params: dict, *, max_position_embeddings: int | None = None) -> Scaling | None:
    """Build a scaling method from a transformers ``rope_parameters`` (or ``rope_scaling``) dict.

    ``rope_theta`` and ``partial_rotary_factor`` are ignored here (they are arguments
    of :func:`inv_freq`); ``rope_type`` (or ``type``) picks the method.
    ``max_position_embeddings`` is the config attribute transformers reads beside the
    dict: ``dynamic`` needs it, and ``yarn`` / ``longrope`` without a ``factor`` take
    ``max_position_embeddings / original_max_position_embeddings`` as theirs.
    """
    kind = params.get("rope_type", params.get("type", "default"))
    classes = {"linear": Linear, "dynamic": DynamicNTK, "yarn": YaRN, "llama3": Llama3, "longrope": LongRoPE}
    if kind == "default":
        return None
    if kind not in classes:
        raise ValueError(f"rope_type {kind!r} is not supported; expected one of {['default', *classes]}")
    cls = classes[kind]
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in params.items() if k in names and v is not None}
    if kind == "dynamic":
        kwargs.setdefault("max_position_embeddings", max_position_embeddings)
        if kwargs["max_position_embeddings"] is None:
            raise ValueError("rope_type 'dynamic' needs max_position_embeddings (a config attribute): pass it")
    if kind in ("yarn", "longrope") and "factor" not in kwargs:
        original = kwargs.get("original_max_position_embeddings")
        if max_position_embeddings is not None and original:
            kwargs["factor"] = max_position_embeddings / original
        elif kind == "yarn":
            raise ValueError("rope_type 'yarn' without 'factor' needs max_position_embeddings to derive it: pass it")
    return cls(**kwargs)
