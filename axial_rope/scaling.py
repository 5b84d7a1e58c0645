"""Frequency schedules of one rotary axis: the base spectrum and its scaling methods.

Every function here returns ``(inv_freq, attention_factor)``: a float64 tensor of
``dim // 2`` inverse frequencies (radians per unit of position) and a python float
that multiplies cos and sin (so attention logits scale by its square). ``dim`` is
the rotary width of the axis, so each axis of an :class:`~axial_rope.AxialRoPE`
uses its own width in every exponent.

The methods are frozen dataclasses whose field names follow the keys of transformers'
``rope_parameters``, so a config converts one-to-one; the rules follow
``transformers.modeling_rope_utils`` (checked in ``tests/test_scaling.py``). Fields are
checked on construction (:meth:`Scaling.__post_init__`); ``docs/scaling.md`` lists the rules.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import MISSING, dataclass, fields
from typing import ClassVar

import torch

from .hf_config import CONFIG_KEYS, fill_lengths
from .scaling_checks import as_floats, as_int, check_positive, check_theta_above_one

__all__ = [
    "Linear", "NTK", "DynamicNTK", "YaRN", "Llama3", "LongRoPE", "RIFLEx", "Scaling", "REGISTRY", "CONFIG_KEYS",
    "from_dict", "base_inv_freq", "inv_freq", "from_rope_parameters", "yarn_mscale", "yarn_pair_index", "yarn_ramp",
]  # fmt: skip


class Scaling:
    """Base of the scaling methods: frozen dataclasses that map ``(dim, theta, seq_len)`` to ``(inv_freq, factor)``.

    ``rope_type`` names the method in configs (transformers' name where it has one);
    ``length_dependent`` says whether the frequencies depend on the length processed.
    Subclasses register themselves in :data:`REGISTRY` under their ``rope_type``; :meth:`to_dict`,
    :func:`from_dict` and the field checks work from the fields, so adding a method is one class.
    """

    rope_type: ClassVar[str]
    length_dependent: ClassVar[bool] = False
    # float fields where 0 is allowed (YaRN's mscale: 0 means unset, as in transformers); others must be > 0
    zero_allowed: ClassVar[tuple[str, ...]] = ()
    int_minimum: ClassVar[dict[str, int]] = {}  # int fields whose least value is not 1
    # what a `factor` < 1 (a shorter context, not a longer one) does: "warn" where transformers only
    # logs a warning and computes with it; "error" where no transformers rule accepts it
    factor_below_one: ClassVar[str] = "warn"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        REGISTRY[cls.rope_type] = cls

    def __post_init__(self):
        """Checks every field by its annotation: ``int`` (normalised, >= 1), ``bool``, ``float`` (finite, > 0),
        ``tuple[float, ...]`` (lists become tuples); ``... | None`` fields may be ``None``."""
        owner = type(self).__name__
        for f in fields(self):
            value, kind = getattr(self, f.name), str(f.type).split(" | ")[0]
            if value is None and str(f.type).endswith("| None"):
                continue
            if kind == "int":
                number = as_int(owner, f.name, value, self.int_minimum.get(f.name, 1))
                object.__setattr__(self, f.name, number)
            elif kind == "bool" and not isinstance(value, bool):
                raise TypeError(f"{owner}: {f.name} must be a bool (True or False), got {value!r}")
            elif kind == "float":
                check_positive(owner, f.name, value, strict=f.name not in self.zero_allowed)
            elif kind.startswith("tuple["):
                object.__setattr__(self, f.name, as_floats(owner, f.name, value))
        factor = getattr(self, "factor", None)
        if factor is not None and factor < 1:
            message = f"{owner}: factor={factor!r} < 1 interpolates to a shorter context than the original"
            if self.factor_below_one == "error":
                raise ValueError(message)
            # point at the caller: past this method, each subclass __post_init__ (they call super) and __init__
            overrides = sum("__post_init__" in vars(c) for c in type(self).__mro__ if c is not Scaling)
            warnings.warn(f"{message} (transformers accepts it with a warning)", UserWarning, stacklevel=3 + overrides)

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        raise NotImplementedError

    def to_dict(self) -> dict:
        """JSON-able ``{"rope_type": ..., field: value, ...}`` (tuples as lists); :func:`from_dict` inverts it."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"rope_type": self.rope_type} | {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


REGISTRY: dict[str, type[Scaling]] = {}


def _build(cls: type[Scaling], values: dict, also_valid: frozenset[str] = frozenset()) -> Scaling:
    """``cls(**values)``, with a ValueError naming unknown keys (and the valid ones) or missing required fields."""
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(values) - set(names) - also_valid)
    if unknown:
        valid = names + sorted(also_valid - set(names))
        raise ValueError(f"{cls.__name__} ({cls.rope_type!r}): unknown key(s) {unknown}; valid keys are {valid}")
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in values]
    if missing:
        raise ValueError(f"{cls.__name__} ({cls.rope_type!r}): missing required field(s) {missing}")
    return cls(**{k: v for k, v in values.items() if k in names})


def from_dict(config: dict) -> Scaling:
    """The scaling method a :meth:`Scaling.to_dict` dict describes (also after a JSON round trip)."""
    if not isinstance(config, dict) or config.get("rope_type") not in REGISTRY:
        kind = config.get("rope_type") if isinstance(config, dict) else config
        raise ValueError(f"a scaling dict needs 'rope_type' in {sorted(REGISTRY)}, got {kind!r}")
    return _build(REGISTRY[config["rope_type"]], {k: v for k, v in config.items() if k != "rope_type"})


def base_inv_freq(dim: int, theta: float = 10000.0) -> torch.Tensor:
    """The unscaled RoPE spectrum ``theta ** (-2j / dim)`` for ``j < dim // 2``, float64 ``[dim // 2]``."""
    if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even int, got {dim!r}")
    check_positive("inv_freq", "theta", theta)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim  # cpu: also under a meta default
    return 1.0 / (float(theta) ** exponent)


@dataclass(frozen=True)
class Linear(Scaling):
    """Position interpolation (Chen et al. 2023): every frequency divided by ``factor``."""

    rope_type = "linear"

    factor: float

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        return base_inv_freq(dim, theta) / self.factor, 1.0


def _grown_theta(owner: str, dim: int, theta: float, growth: float, exponent: bool = True) -> float:
    """NTK's base: ``theta * growth ** (dim / (dim - 2))`` (lowest frequency / growth), or ``theta * growth``."""
    check_theta_above_one(owner, theta, "NTK grows the base; a base <= 1 has no low frequencies to stretch")
    if exponent and dim <= 2:
        raise ValueError(f"{owner}: dim must be > 2 for the d/(d-2) exponent, got {dim}")
    return theta * growth ** (dim / (dim - 2) if exponent else 1)


@dataclass(frozen=True)
class NTK(Scaling):
    """NTK-aware base scaling: ``theta * factor ** (dim / (dim - 2))`` (transformers, FiT).

    ``exponent=False`` gives the plain ``theta * factor`` that diffusers (Lumina) calls NTK.
    ``factor < 1`` is an error: transformers has no fixed NTK, and its ``dynamic`` rule never
    shrinks the base.
    """

    rope_type = "ntk"
    factor_below_one = "error"

    factor: float
    exponent: bool = True

    def scaled_theta(self, dim: int, theta: float) -> float:
        return _grown_theta("NTK", dim, theta, self.factor, self.exponent)

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        return base_inv_freq(dim, self.scaled_theta(dim, theta)), 1.0


@dataclass(frozen=True)
class DynamicNTK(Scaling):
    """Dynamic NTK (transformers' ``dynamic``): the base grows with the length seen.

    Stateless: with ``L = max_position_embeddings``, the spectrum at ``seq_len`` is
    ``f(max(seq_len, L))``, where ``f(l)`` uses ``theta * (factor * l / L - (factor - 1)) ** (dim / (dim - 2))``
    (unscaled for ``l = L``; ``seq_len=None`` means ``L``). That is transformers'
    ``rope_init_fn`` for ``dynamic``. Its rotary module adds state (``dynamic_rope_update``): it keeps
    ``f(c)``, ``c`` the longest length seen since the last length below ``L``, and resets to ``f(L)``
    when a length below ``L`` comes. Both give the same frequencies when ``seq_len < L`` or
    ``seq_len >= c`` (e.g. every step of one generation, whose length only grows); they differ when
    a length in ``[L, c)`` follows a longer one (transformers keeps ``f(c)``: pass ``seq_len=c`` to match).
    """

    rope_type = "dynamic"
    length_dependent = True

    factor: float
    max_position_embeddings: int

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        max_len = self.max_position_embeddings
        length = max_len if seq_len is None else max(seq_len, max_len)
        growth = self.factor * length / max_len - (self.factor - 1)
        return base_inv_freq(dim, _grown_theta("DynamicNTK", dim, theta, growth)), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor of a scale ``s``: ``0.1 mscale ln(s) + 1`` (1 for ``s <= 1``), transformers' ``get_mscale``."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_pair_index(turns: float, dim: int, theta: float, length: int) -> float:
    """The (fractional) pair whose wavelength fits ``turns`` times into ``length`` (``find_correction_dim``)."""
    return dim * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(theta))


def yarn_ramp(inv: torch.Tensor, factor: float, low, high) -> torch.Tensor:
    """YaRN's blend of ``inv`` ``[n]`` with ``inv / factor``, by a ramp linear in the pair index ``j``:
    ``(j - low) / (high - low)`` clamped to ``[0, 1]`` (0: kept, 1: divided by ``factor``).

    ``low``, ``high``: the correction range in pairs, already truncated and clamped (python numbers, or 0-d tensors
    where they depend on a tensor, as DyPE's time); a zero-width range is widened by 0.001, as transformers does.
    The one ramp of :class:`YaRN` and :class:`~axial_rope.time_scaling.DyPE`.
    """
    low = torch.as_tensor(low, dtype=inv.dtype, device=inv.device)
    high = torch.as_tensor(high, dtype=inv.dtype, device=inv.device)
    high = torch.where(high == low, high + 0.001, high)
    ramp = ((torch.arange(inv.shape[-1], dtype=inv.dtype, device=inv.device) - low) / (high - low)).clamp(0, 1)
    return inv / factor * ramp + inv * (1 - ramp)


@dataclass(frozen=True)
class YaRN(Scaling):
    """YaRN (Peng et al. 2023) with transformers' rules.

    High frequencies (more than ``beta_fast`` turns over the original length) keep
    their value, low ones (fewer than ``beta_slow`` turns) are interpolated by
    ``factor``; between, a ramp that is linear in the pair index. The correction
    range is floored/ceiled when ``truncate``. The attention factor is
    ``attention_factor`` if given, else ``mscale(factor, mscale) / mscale(factor,
    mscale_all_dim)`` when both are set (non-zero), else ``0.1 ln(factor) + 1``.
    """

    rope_type = "yarn"
    zero_allowed = ("mscale", "mscale_all_dim")

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.beta_fast < self.beta_slow:  # transformers only warns; the ramp would run backwards
            raise ValueError(f"YaRN: beta_fast ({self.beta_fast}) must be >= beta_slow ({self.beta_slow})")

    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        original = self.original_max_position_embeddings
        check_theta_above_one("YaRN", theta, "the ramp divides by log(theta)")
        low = yarn_pair_index(self.beta_fast, dim, theta, original)
        high = yarn_pair_index(self.beta_slow, dim, theta, original)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        return yarn_ramp(base_inv_freq(dim, theta), self.factor, low, high), self.attention_scale()


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
        super().__post_init__()
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"Llama3: high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor ({self.low_freq_factor})"
            )

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        base = base_inv_freq(dim, theta)
        length = self.original_max_position_embeddings
        wavelen = 2 * math.pi / base
        smooth = (length / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smooth = smooth.clamp(0, 1)  # 0 for wavelengths > L / low_freq_factor, 1 for those < L / high_freq_factor
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
    int_minimum = {"original_max_position_embeddings": 2}  # the attention factor divides by log(L)

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float | None = None
    attention_factor: float | None = None

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
        rescale = torch.tensor(rescale, dtype=torch.float64, device="cpu")  # [dim // 2]
        return base_inv_freq(dim, theta) / rescale, self.attention_scale()


@dataclass(frozen=True)
class RIFLEx(Scaling):
    """RIFLEx (Zhao et al. 2025): the intrinsic frequency, pair ``k - 1``, gets ``0.9 * 2 pi / test_length``.

    Used on the temporal axis of a video model so that pair completes less than
    one period over the ``test_length`` frames (latent frames) generated.
    ``k`` is the 1-based pair index.
    """

    rope_type = "riflex"

    k: int
    test_length: int

    @staticmethod
    def intrinsic_k(dim: int, theta: float, train_length: int, *, repetition_frame: float | None = None) -> int:
        """The intrinsic pair (1-based) that RIFLEx reins in, as the paper picks it.

        A pair whose period ``N_j = 2 pi / f_j`` is at most the training length (in latent frames)
        completes a turn inside every training clip, so the model has learnt not to repeat at it;
        the first pair (from the highest frequency down) whose period exceeds ``train_length``
        completes its first turn only beyond it, and the video repeats after ``N_k`` frames. With
        ``repetition_frame`` (the first frame, in latent frames, at which a generated video was seen
        to repeat), the pair whose period is closest to it, Eq. (7) of Zhao et al. 2025 (the authors'
        ``identify_k``). Both give the paper's choices: HunyuanVideo (``dim=16``, ``theta=256``, 33
        latent frames) k = 4 (period 50.3), CogVideoX (``dim=16``, ``theta=10000``, 13) k = 2 (19.9).

        Raises ``ValueError`` when every period is at most ``train_length`` (nothing to rein in).
        """
        periods = 2 * math.pi / base_inv_freq(dim, theta)  # [dim // 2], increasing
        if repetition_frame is not None:
            return int((periods - repetition_frame).abs().argmin()) + 1
        longer = (periods > train_length).nonzero()
        if not len(longer):
            raise ValueError(
                f"RIFLEx: every period of the axis ({float(periods[-1]):.1f} frames at most) fits in the training "
                f"length {train_length}: no pair first turns beyond it"
            )
        return int(longer[0]) + 1

    def __call__(self, dim: int, theta: float, seq_len: int | None) -> tuple[torch.Tensor, float]:
        inv = base_inv_freq(dim, theta)
        if self.k > dim // 2:
            raise ValueError(f"RIFLEx: k={self.k} exceeds the axis' {dim // 2} pairs")
        inv[self.k - 1] = 0.9 * 2 * math.pi / self.test_length
        return inv, 1.0


def inv_freq(
    dim: int, theta: float = 10000.0, scaling: Scaling | None = None, *, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of one rotary axis: float64 ``[dim // 2]`` and the attention factor (a float).

    ``dim`` is the rotary width of the axis (even), ``theta`` the base (``rope_theta``), ``scaling``
    a method of :mod:`axial_rope.scaling` or ``None``; ``seq_len``, the length being processed,
    is used by the length-dependent methods (:class:`DynamicNTK`, :class:`LongRoPE`) only.
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


def from_rope_parameters(params: dict | None, *, max_position_embeddings: int | None = None) -> Scaling | None:
    """Build a scaling method from a transformers ``rope_parameters`` (or ``rope_scaling``) dict.

    ``None``, ``{}`` and ``rope_type="default"`` give ``None`` (plain RoPE). ``rope_type`` (or ``type``)
    picks the method from :data:`axial_rope.scaling.REGISTRY`; other keys must be its fields or :data:`CONFIG_KEYS`
    (ignored). ``null`` means the field's default, except ``truncate: null``: no truncation, as in
    transformers. ``max_position_embeddings`` (the config attribute) fills ``dynamic``'s length and a
    missing ``original_max_position_embeddings``, and gives ``yarn`` / ``longrope`` without ``factor``
    ``max_position_embeddings / original_max_position_embeddings``, as transformers does (Phi-3 keeps
    ``original_max_position_embeddings`` on the config: pass ``config.rope_parameters``, which has it).
    """
    if params is None:
        return None  # a config without rope_scaling: default RoPE
    if not isinstance(params, dict):
        raise TypeError(f"rope_parameters must be a dict or None, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        unknown = sorted(set(params) - CONFIG_KEYS)
        if unknown:  # a misspelt 'rope_type' lands here too; a per-layer-type dict needs one entry at a time
            raise ValueError(f"rope_type 'default': unknown key(s) {unknown}; valid keys are {sorted(CONFIG_KEYS)}")
        return None
    if kind not in REGISTRY:
        raise ValueError(f"rope_type {kind!r} is not supported; expected one of {['default', *REGISTRY]}")
    cls = REGISTRY[kind]
    names = {f.name for f in fields(cls)}
    if max_position_embeddings is None:
        max_position_embeddings = params.get("max_position_embeddings")  # Ministral 3 keeps a copy here
    values = {k: v for k, v in params.items() if k in names or k not in CONFIG_KEYS}
    if "truncate" in values and values["truncate"] is None:
        values["truncate"] = False  # transformers tests `if truncate:`, so null does not truncate
    values = {k: v for k, v in values.items() if v is not None}
    fill_lengths(kind, names, values, max_position_embeddings)
    return _build(cls, values, also_valid=CONFIG_KEYS)
