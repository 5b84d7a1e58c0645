"""``AxialRoPE``: the rotary layout of one attention head over 1, 2 or 3 coordinate axes.

A head's first ``rot_dim`` channels form ``n_pairs = rot_dim / 2`` planes. Plane ``j``
turns by ``sum_a T_a(pos[a]) * F[a, j]``: the frequency model
(:class:`~axial_rope.frequencies.Frequencies`) holds ``F`` (``[n_axes, n_pairs]``, or per
head ``[H, n_axes, n_pairs]``), the attention factor per plane and the position map ``T``.
The constructor's ``axes_dim``/``theta``/``scaling``/``spectrum`` build the axial ``F``
(one non-zero per column, ``rot_dim = sum(axes_dim)``); :meth:`AxialRoPE.from_frequencies`
takes any model. The ``pairing`` decides which two channels form a plane.

A rope is a :class:`~axial_rope.rotary.Rotary`: :meth:`AxialRoPE.rotation` describes the rotation
of given positions as tensors, and every call (``rope(q, k, pos)``, ``rotate``, ``norm_and_rotate``,
``cos_sin``) hands that description to the backends. Its buffers (``F``, the attention factor) are
computed from its arguments when it is built and whenever it moves (``to``, ``to_empty``), never copied
from another device, so a rope built under ``torch.device("meta")`` is right after ``to_empty``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .frequencies import SPECTRA, Frequencies, per_axis, plane_axes, scaling_method, spectrum_frequencies
from .ops import PAIRINGS, check_choice, has_float64, preload
from .ops.rotation import Rotation
from .ops.turns import fixed_turns
from .position_checks import check_positions
from .rotary import Rotary, as_positions
from .scaling import Scaling
from .time_scaling import is_time_dependent, time_of_call
from .timed_rope import OWN_SCALING, TimedRoPE

__all__ = ["AxialRoPE", "TimedRoPE", "ANGLES", "SPECTRA", "check_positions", "plane_axes"]

ANGLES = ("auto", "float64", "turns")


class AxialRoPE(nn.Module, Rotary):
    """Rotary position embedding over one or more coordinate axes.

    Args:
        axes_dim: rotary channels per axis, each even; ``(d,)`` or ``d`` for 1-D RoPE,
            ``(d_y, d_x)`` for images, ``(d_t, d_y, d_x)`` for video. Or a
            :class:`~axial_rope.frequencies.Frequencies` model (then ``theta``, ``scaling`` and
            ``spectrum`` stay at their defaults; :meth:`from_frequencies` says it by name).
        theta: base of the spectrum; one for all axes or one per axis (``per_axis`` only).
        scaling: a method of :mod:`axial_rope.scaling` (or ``None``, or a method's dict form
            ``{"rope_type": ..., ...}``); one for all axes or a tuple with one per axis
            (``None`` = unscaled axis; ``per_axis`` only).
        pairing: ``"interleaved"``: planes are channels ``(2j, 2j+1)``; ``"half"``:
            ``(j, j + rot_dim / 2)``.
        spectrum: ``"per_axis"``: axis ``a`` owns ``axes_dim[a] / 2`` consecutive planes with
            its own spectrum ``theta_a ** (-2i / d_a)``; ``"split"``: one spectrum over
            ``rot_dim`` cut into consecutive per-axis sections (Qwen2-VL M-RoPE);
            ``"cycled"``: one spectrum whose successive planes cycle through the axes (Qwen3-VL).
            A rope built from a frequency model has ``spectrum = None``.
        plane_order: the spectrum's planes in another order (a permutation of ``range(rot_dim / 2)``):
            plane ``j`` of the rope is plane ``plane_order[j]`` of the spectrum, for heads that lay one axis's
            planes before another's (Hunyuan-DiT: x first) or alternate them (Lumina-Next); scaling acts on
            the spectrum as it does in spectrum order. ``None``: the spectrum's order.
        learnable: hold ``F`` as a dense trainable parameter initialised from the model's
            ``F`` (RoPE-Mixed); with ``num_heads``, one ``F`` per head ``[H, n_axes, n_pairs]``.
        backend: default backend for this module (see :func:`axial_rope.apply_rope`).
        angles: how angles are computed: ``"float64"`` (one exactly rounded float64 product per plane),
            ``"turns"`` (int64 fixed-point turns, :mod:`axial_rope.ops.turns`: no float64 tensor on the
            compute device, for Apple MPS and NPUs without float64), or ``"auto"``: float64 where the
            device has it, else turns (decided on every move, ``rope.to(device)``).

    Channels past ``rot_dim`` pass through unrotated. A time-dependent ``scaling``
    (:mod:`axial_rope.time_scaling`: DyPE, Lumina-Next) needs the sampling time per call: ``t=`` on
    each call, or ``rope.at_time(t)`` once per step; its ``freqs`` buffer holds ``F`` at ``t = 1``.
    """

    forward = Rotary.forward  # nn.Module's __call__ (hooks included) runs the shared rotation call

    def __init__(
        self,
        axes_dim: int | Sequence[int] | Frequencies,
        theta: float | Sequence[float] = 10000.0,
        scaling: Scaling | None | Sequence[Scaling | None] = None,
        pairing: str = "interleaved",
        spectrum: str = "per_axis",
        *,
        learnable: bool = False,
        num_heads: int | None = None,
        backend: str | None = None,
        angles: str = "auto",
        plane_order: Sequence[int] | None = None,
    ):
        super().__init__()
        preload()  # backends imported now, not inside a later torch.compile trace
        check_choice("pairing", pairing, PAIRINGS)
        check_choice("angles", angles, ANGLES)
        self.angles = angles
        with torch.device("cpu"):  # the description is computed on the CPU, also under a meta default device
            if isinstance(axes_dim, Frequencies):
                if plane_order is not None:
                    raise ValueError("plane_order orders a spectrum's planes; a frequency model has its own order")
                self._init_model(axes_dim, theta, scaling, spectrum)
            else:
                self._init_spectrum(axes_dim, theta, scaling, spectrum, plane_order)
        self.pairing, self.backend = pairing, backend
        model = self.frequency_model
        # sizes as ints, read once: a compiled forward then never reads the model's CPU tensors (whose shapes
        # dynamo would otherwise trace, and guard on, as inputs)
        self._n_axes, self._n_pairs = model.n_axes, model.n_pairs
        if learnable and self.time_dependent:
            raise ValueError("learnable=True takes F as a parameter; a time-dependent scaling computes F from t")
        if num_heads is not None and (not learnable or not isinstance(num_heads, int) or num_heads <= 0):
            raise ValueError(f"num_heads (per-head frequencies) needs learnable=True and an int > 0, got {num_heads!r}")
        if num_heads is not None and model.num_heads not in (None, num_heads):
            raise ValueError(f"num_heads={num_heads} differs from the model's {model.num_heads} per-head frequencies")
        scale = model.scale if model.scale is not None else torch.ones(model.n_pairs, dtype=torch.float64, device="cpu")
        device = torch.get_default_device()  # meta under torch.device("meta"): to_empty recomputes (_apply)
        for name in ("freqs", "scale", "turns"):  # F [A, n] | [H, A, n], factor [n]; turns: F in fixed point
            self.register_buffer(name, None, persistent=False)
        self._set_buffers(model.freqs, scale, device)
        self.transform = model.transform  # position map (float64) before the angle, or None
        self.scaled = bool((scale != 1).any())  # whether cos/sin carry an attention factor
        self._factors = sorted(set(scale.tolist()))  # python floats: read later without a host sync
        self.learned_freqs = None
        if learnable:
            shape = model.freqs.shape if num_heads is None or model.freqs.ndim == 3 else (num_heads, *model.freqs.shape)
            self.learned_freqs = nn.Parameter(torch.empty(shape, dtype=torch.float32, device=device))
            self.reset_parameters()

    def _init_spectrum(self, axes_dim, theta, scaling, spectrum, plane_order=None) -> None:
        """``F`` from the axes and a spectrum, built as :meth:`Frequencies.from_spectrum` does (planes reordered by
        ``plane_order``)."""
        axes_dim = tuple(axes_dim) if isinstance(axes_dim, (tuple, list)) else (axes_dim,)
        if not axes_dim or any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 or d % 2 for d in axes_dim):
            raise ValueError(f"axes_dim must be positive even ints, one per axis, got {axes_dim!r}")
        check_choice("spectrum", spectrum, SPECTRA)
        shared = spectrum != "per_axis"
        self.axes_dim, self.spectrum = axes_dim, spectrum
        self.theta = per_axis("theta", theta, len(axes_dim), shared)
        self.scaling = self.per_axis_scaling(scaling)
        self.plane_order = _plane_order(plane_order, sum(axes_dim) // 2)
        self.plane_axis = plane_axes(axes_dim, spectrum)
        if self.plane_order is not None:
            self.plane_axis = [self.plane_axis[j] for j in self.plane_order]
        self.length_dependent = any(s is not None and s.length_dependent for s in self.scaling)
        self.time_dependent = any(is_time_dependent(s) for s in self.scaling)
        # validates theta and every method against its axis; a time-dependent rope's buffers hold F(t = 1)
        freqs, scale = self.frequencies(t=1.0 if self.time_dependent else None)
        self.frequency_model = Frequencies(freqs, scale if bool((scale != 1).any()) else None)

    def _init_model(self, model: Frequencies, theta, scaling, spectrum) -> None:
        """A given frequency model: fixed ``F``, no spectrum and no scaling method."""
        if theta != 10000.0 or scaling is not None or spectrum != "per_axis":
            raise ValueError(
                "AxialRoPE(frequencies) takes F from the model: leave theta, scaling and spectrum at their "
                f"defaults (got theta={theta!r}, scaling={scaling!r}, spectrum={spectrum!r})"
            )
        self.frequency_model = model
        self.axes_dim, self.spectrum, self.plane_order = model.axes_dim, None, None
        self.theta, self.scaling = None, (None,) * model.n_axes
        self.plane_axis = model.plane_axis
        self.length_dependent = self.time_dependent = False

    @classmethod
    def from_frequencies(
        cls, frequencies: Frequencies, pairing: str = "interleaved", *, learnable: bool = False, backend=None
    ) -> AxialRoPE:
        """A rope with the general frequency model ``frequencies``: any ``F`` (per head too), mask and position map.

        Fixed (buffers, moved with the module) or, with ``learnable=True``, a trainable float32
        parameter initialised from it. ``rot_dim`` is ``2 * frequencies.n_pairs``.
        """
        if not isinstance(frequencies, Frequencies):
            raise TypeError(f"from_frequencies takes an axial_rope.frequencies.Frequencies, got {frequencies!r}")
        return cls(frequencies, pairing=pairing, learnable=learnable, backend=backend)

    def float64_angles(self, device: torch.device | None = None) -> bool:
        """Whether angles are float64 on ``device`` (default: the rope's); else int64 fixed-point turns."""
        device = self.freqs.device if device is None else torch.device(device)
        return self.angles == "float64" or (self.angles == "auto" and has_float64(device))

    def _set_buffers(self, freqs: torch.Tensor, scale: torch.Tensor, device: torch.device) -> None:
        """The buffers on ``device`` from ``F`` and the factor (float64, CPU): float64 there, or, where angles go by
        turns, float32 ``F`` and factor with int64 ``turns`` (converted on the CPU: nothing float64 moves)."""
        if self.float64_angles(device):
            self.freqs, self.scale, self.turns = freqs.to(device, copy=True), scale.to(device, copy=True), None
        else:
            self.freqs, self.scale = freqs.float().to(device), scale.float().to(device)
            self.turns = fixed_turns(freqs).to(device)

    @property
    def n_axes(self) -> int:
        return self._n_axes

    @property
    def rot_dim(self) -> int:
        return 2 * self._n_pairs

    @property
    def n_pairs(self) -> int:
        return self._n_pairs

    @property
    def attention_factor(self) -> float:
        """The scaling's attention factor, when all planes share one (``ValueError`` otherwise)."""
        if len(self._factors) != 1:
            raise ValueError(f"the axes have different attention factors {self._factors}")
        return self._factors[0]

    def per_axis_scaling(self, scaling) -> tuple[Scaling | None, ...]:
        """``scaling`` as one method (or ``None``) per axis, from one method, a per-axis tuple or their dict forms
        (a shared spectrum takes one method for all axes)."""
        shared = self.spectrum != "per_axis"
        return tuple(scaling_method(s) for s in per_axis("scaling", scaling, len(self.axes_dim), shared))

    def frequencies(
        self,
        seq_len: int | Sequence[int] | None = None,
        *,
        t: float | torch.Tensor | None = None,
        scaling=OWN_SCALING,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The frequency matrix ``F`` and the attention factor per plane, for a length (and a time).

        Args:
            seq_len: length per axis (or one for all) seen by length-dependent methods
                (:class:`~axial_rope.scaling.DynamicNTK`, :class:`~axial_rope.scaling.LongRoPE`);
                a rope built from a frequency model has none.
            t: sampling time (noise level in ``[0, 1]``), needed by time-dependent methods
                (:mod:`axial_rope.time_scaling`), ignored by the others.
            scaling: another scaling for the same axes (one method, or one per axis), instead of the rope's.

        Returns:
            ``F`` float64 ``[n_axes, n_pairs]`` (per head ``[H, n_axes, n_pairs]``) and ``scale`` float64
            ``[n_pairs]``, on the CPU (with a time-dependent method, on ``t``'s device).
        """
        if self.spectrum is None:  # copies: the buffers must not alias the (immutable) model
            if scaling is not OWN_SCALING and any(s is not None for s in per_axis("scaling", scaling, self.n_axes)):
                raise ValueError("scaling needs a spectrum (axes_dim, theta); this rope has a fixed frequency model")
            model = self.frequency_model
            scale = (
                model.scale if model.scale is not None else torch.ones(model.n_pairs, dtype=torch.float64, device="cpu")
            )
            return model.freqs.clone(), scale.clone()
        methods = self.scaling if scaling is OWN_SCALING else self.per_axis_scaling(scaling)
        freqs, scale = self._spectrum(methods, seq_len, t)
        return freqs, (
            torch.ones(freqs.shape[-1], dtype=torch.float64, device=freqs.device) if scale is None else scale
        )

    def _spectrum(self, methods, seq_len, t, dtype=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        n_axes = len(self.axes_dim)
        lengths = per_axis("seq_len", seq_len, n_axes, False) if seq_len is not None else (None,) * n_axes
        freqs, scale = spectrum_frequencies(self.axes_dim, self.theta, methods, self.spectrum, lengths, t, dtype)
        if self.plane_order is None:
            return freqs, scale
        order = torch.tensor(self.plane_order, device=freqs.device)
        return freqs[..., order], None if scale is None else scale[order]

    def with_scaling(self, scaling: Scaling | None | Sequence[Scaling | None]) -> AxialRoPE:
        """The same rotary layout with another ``scaling`` (one method or one per axis), on this rope's device.

        A new module: build it outside ``forward``. Inside a forward, rotate with
        ``rope.rotation(pos, scaling=...)`` (or ``rope(q, k, pos)`` of a rope built once) instead.
        An all-``None`` scaling equal to this rope's returns ``self``.
        """
        if self.learned_freqs is not None:
            raise ValueError("with_scaling needs fixed frequencies; this rope learns its own (learnable=True)")
        methods = self.per_axis_scaling(scaling)
        if methods == self.scaling:
            return self
        if self.spectrum is None:
            raise ValueError("with_scaling needs a spectrum (axes_dim, theta); this rope has a frequency model")
        theta = self.theta if self.spectrum == "per_axis" else self.theta[0]
        scaling = methods if self.spectrum == "per_axis" else methods[0]
        rope = AxialRoPE(self.axes_dim, theta, scaling, self.pairing, self.spectrum, backend=self.backend,
                         plane_order=self.plane_order)  # fmt: skip
        return rope.to(self.freqs.device)

    def reset_parameters(self) -> None:
        """Recompute the buffers (``F``, attention factor) on their device and reset a learned ``F`` to the model's.

        The constructor calls it; after ``to_empty`` (meta-device construction) the buffers are already
        recomputed by the move, and this restores a learned ``F``'s initial values.
        """
        with torch.device("cpu"):
            freqs, scale = self.frequencies(t=1.0 if self.time_dependent else None)
        device = self.freqs.device
        if device.type != "meta":
            self._set_buffers(freqs, scale, device)
        if self.learned_freqs is not None:
            init = freqs if self.learned_freqs.ndim == freqs.ndim else freqs.expand(self.learned_freqs.shape)
            with torch.no_grad():
                self.learned_freqs.copy_(init.to(self.learned_freqs.device, torch.float32))

    def _apply(self, fn, recurse=True):
        # .half() / .to(dtype) / .to_empty() must not round or lose the frequencies: the buffers are recomputed
        # on the new device, float64 ones moved as float32 stand-ins first (a device without float64 cannot take
        # them), and a learned F keeps its float32 values.
        learned = None if self.learned_freqs is None else self.learned_freqs.data
        self.freqs, self.scale, self.turns = self.freqs.float(), self.scale.float(), None
        super()._apply(fn, recurse)
        with torch.device("cpu"):
            freqs, scale = self.frequencies(t=1.0 if self.time_dependent else None)
        self._set_buffers(freqs, scale, self.freqs.device)
        if learned is not None and self.learned_freqs.dtype != learned.dtype:
            self.learned_freqs.data = learned.to(self.learned_freqs.device)
        return self

    # -- the rotation ----------------------------------------------------------------

    def positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Checked positions as ``[B|1, S, n_axes]``, the position map applied (float64 after it; float32 where
        angles go by turns)."""
        pos = as_positions(pos, self.n_axes)
        if self.transform is None:
            return pos
        return self.transform(pos, torch.float64 if self.float64_angles() else torch.float32)

    def rotation(
        self,
        pos: torch.Tensor,
        *,
        seq_len: int | Sequence[int] | None = None,
        t: float | torch.Tensor | None = None,
        scaling=OWN_SCALING,
    ) -> Rotation:
        """The rotation of the tokens at ``pos``: positions, ``F`` and attention factor, as tensors.

        Args:
            pos: ``[S, n_axes]`` or ``[B, S, n_axes]`` (1-D: ``[S]`` too).
            seq_len: length per axis for length-dependent scaling (default ``max(pos) + 1``, a host read).
            t: sampling time of a time-dependent scaling (see :meth:`forward`).
            scaling: another scaling for this call (one method, or one per axis, e.g.
                ``ar.positions_for_size(...).scaling``): its ``F`` is computed here, no module is built.
        """
        pos = self.positions(pos)
        freqs, factor, turns = self.call_frequencies(pos, seq_len=seq_len, t=t, scaling=scaling)
        return Rotation(pos, freqs, factor, self.pairing, turns)

    def call_frequencies(
        self, pos: torch.Tensor | None = None, *, seq_len=None, t=None, scaling=OWN_SCALING
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """What :meth:`rotation` turns by, apart from the positions: ``F``, the attention factor (``None``: 1) and ``F``'s
        turns (``None``: float64 angles), on the rope's device. ``pos`` (``[B|1, S, n_axes]``, checked) serves only
        the default ``seq_len`` of a length-dependent method; every branch is decided on Python values."""
        if self.learned_freqs is not None:
            if scaling is not OWN_SCALING:
                raise ValueError("scaling= needs fixed frequencies; this rope learns its own (learnable=True)")
            return self.learned_freqs, (self.scale if self.scaled else None), None  # float32, with its gradient
        methods = self.scaling if scaling is OWN_SCALING else self.per_axis_scaling(scaling)
        fixed = not any(m is not None and (m.length_dependent or is_time_dependent(m)) for m in methods)
        if fixed and methods == self.scaling:  # the buffers as they are
            return self.freqs, (self.scale if self.scaled else None), self.turns
        if self.spectrum is None:
            raise ValueError("scaling= needs a spectrum (axes_dim, theta); this rope has a fixed frequency model")
        if any(m is not None and m.length_dependent for m in methods) and seq_len is None:
            seq_len = tuple(int(v) + 1 for v in pos.flatten(0, -2).amax(0).tolist())  # host read: pass seq_len
        timed = any(is_time_dependent(m) for m in methods)
        device, exact = self.freqs.device, self.float64_angles()
        dtype = torch.float64 if exact else torch.float32  # a time-dependent F(t) is computed on the device
        freqs, scale = self._spectrum(
            methods, seq_len, time_of_call(t, methods, device, dtype) if timed else None, dtype
        )
        turns = None if exact else fixed_turns(freqs).to(device)  # from float64 on the CPU, or F(t)'s float32
        freqs, scale = freqs.to(device, dtype), None if scale is None else scale.to(device, dtype)
        return freqs, scale, turns

    def at_time(self, t: float | torch.Tensor) -> AxialRoPE | TimedRoPE:
        """This rope at sampling time ``t``, ``F(t)`` computed once: it takes a rope's calls without ``t`` (``rope=``
        of :class:`~axial_rope.Attention`, ``DiTBlock``). A rope without a time-dependent method returns itself."""
        return TimedRoPE(self, t) if self.time_dependent else self

    def extra_repr(self) -> str:
        learned = f", learnable={tuple(self.learned_freqs.shape)}" if self.learned_freqs is not None else ""
        if self.spectrum is None:
            model = self.frequency_model
            heads = "" if model.num_heads is None else f", heads={model.num_heads}"
            transform = "" if model.transform is None else f", transform={model.transform}"
            return (
                f"frequencies=[n_axes={model.n_axes}, n_pairs={model.n_pairs}{heads}, "
                f"unrotated={int(model.unrotated.sum())}], pairing={self.pairing!r}{transform}{learned}"
            )
        theta = self.theta[0] if len(set(self.theta)) == 1 else self.theta
        scaling = self.scaling[0] if len(set(self.scaling)) == 1 else self.scaling
        return (
            f"axes_dim={self.axes_dim}, theta={theta}, scaling={scaling}, pairing={self.pairing!r}, "
            f"spectrum={self.spectrum!r}{learned}"
        )


def _plane_order(order, n_pairs: int) -> tuple[int, ...] | None:
    """``plane_order`` checked: ``None`` or a permutation of ``range(n_pairs)`` (``ValueError`` naming it)."""
    if order is None:
        return None
    order = tuple(order) if isinstance(order, (list, tuple)) else order
    if (
        not isinstance(order, tuple)
        or sorted(order) != list(range(n_pairs))
        or any(not isinstance(j, int) or isinstance(j, bool) for j in order)
    ):
        raise ValueError(f"plane_order must be a permutation of range({n_pairs}) (the planes), got {order!r}")
    return order
