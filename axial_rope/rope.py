"""``AxialRoPE``: the rotary layout of one attention head over 1, 2 or 3 coordinate axes.

A head's first ``rot_dim`` channels form ``n_pairs = rot_dim / 2`` planes. Plane ``j``
turns by ``sum_a T_a(pos[a]) * F[a, j]``: the frequency model
(:class:`~axial_rope.frequencies.Frequencies`) holds ``F`` (``[n_axes, n_pairs]``, or per
head ``[H, n_axes, n_pairs]``), the attention factor per plane and the position map ``T``.
The constructor's ``axes_dim``/``theta``/``scaling``/``spectrum`` build the axial ``F``
(one non-zero per column, ``rot_dim = sum(axes_dim)``); :meth:`AxialRoPE.from_frequencies`
takes any model. The ``pairing`` decides which two channels form a plane.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .frequencies import SPECTRA, Frequencies, plane_axes, spectrum_frequencies
from .frequencies import per_axis as _per_axis
from .frequencies import scaling_method as _scaling_method
from .ops import PAIRINGS, norm_rotate_qk, preload, rotate_qk
from .ops.common import channel_table, check_choice, check_qk, check_tensor, plane_cos_sin, seq_dim
from .position_checks import check_positions
from .scaling import Scaling
from .time_scaling import TimedRoPE, TimeFrequencies, frequencies_at, is_time_dependent

__all__ = ["AxialRoPE", "SPECTRA", "check_positions", "plane_axes"]


class AxialRoPE(nn.Module):
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
        learnable: hold ``F`` as a dense trainable parameter initialised from the model's
            ``F`` (RoPE-Mixed); with ``num_heads``, one ``F`` per head ``[H, n_axes, n_pairs]``.
        backend: default backend for this module (see :func:`axial_rope.apply_rope`).

    Channels past ``rot_dim`` pass through unrotated. A time-dependent ``scaling``
    (:mod:`axial_rope.time_scaling`: DyPE, Lumina-Next) needs the sampling time per call: ``t=`` on
    each call, or ``rope.at_time(t)`` once per step; its ``freqs`` buffer holds ``F`` at ``t = 1``.
    """

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
    ):
        super().__init__()
        preload()  # backends imported now, not inside a later torch.compile trace
        check_choice("pairing", pairing, PAIRINGS)
        if isinstance(axes_dim, Frequencies):
            self._init_model(axes_dim, theta, scaling, spectrum)
        else:
            self._init_spectrum(axes_dim, theta, scaling, spectrum)
        self.pairing, self.backend = pairing, backend
        model = self.frequency_model
        if learnable and self.time_dependent:
            raise ValueError("learnable=True takes F as a parameter; a time-dependent scaling computes F from t")
        if num_heads is not None and (not learnable or not isinstance(num_heads, int) or num_heads <= 0):
            raise ValueError(f"num_heads (per-head frequencies) needs learnable=True and an int > 0, got {num_heads!r}")
        if num_heads is not None and model.num_heads not in (None, num_heads):
            raise ValueError(f"num_heads={num_heads} differs from the model's {model.num_heads} per-head frequencies")
        freqs, scale = model.freqs, model.scale
        scale = torch.ones(model.n_pairs, dtype=torch.float64) if scale is None else scale
        # copies: in-place edits of the buffers must not reach the (immutable) model
        self.register_buffer("freqs", freqs.clone(), persistent=False)  # [n_axes, n] or [H, n_axes, n] float64
        self.register_buffer("scale", scale.clone(), persistent=False)  # [n_pairs] float64
        self.transform = model.transform  # position map (float64) before the angle, or None
        self.scaled = bool((scale != 1).any())  # whether cos/sin carry an attention factor
        self._factors = sorted(set(scale.tolist()))  # python floats: read later without a host sync
        self.learned_freqs = None
        if learnable:
            init = freqs if num_heads is None or freqs.ndim == 3 else freqs.expand(num_heads, *freqs.shape)
            self.learned_freqs = nn.Parameter(init.to(torch.float32).clone())

    def _init_spectrum(self, axes_dim, theta, scaling, spectrum) -> None:
        """``F`` from the axes and a spectrum, built as :meth:`Frequencies.from_spectrum` does."""
        axes_dim = tuple(axes_dim) if isinstance(axes_dim, (tuple, list)) else (axes_dim,)
        if not axes_dim or any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 or d % 2 for d in axes_dim):
            raise ValueError(f"axes_dim must be positive even ints, one per axis, got {axes_dim!r}")
        check_choice("spectrum", spectrum, SPECTRA)
        shared = spectrum != "per_axis"
        self.axes_dim, self.spectrum = axes_dim, spectrum
        self.theta = _per_axis("theta", theta, len(axes_dim), shared)
        self.scaling = tuple(_scaling_method(s) for s in _per_axis("scaling", scaling, len(axes_dim), shared))
        self.plane_axis = plane_axes(axes_dim, spectrum)
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
        self.axes_dim, self.spectrum = model.axes_dim, "custom"
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

    @property
    def n_axes(self) -> int:
        return self.frequency_model.n_axes

    @property
    def rot_dim(self) -> int:
        return 2 * self.frequency_model.n_pairs

    @property
    def n_pairs(self) -> int:
        return self.frequency_model.n_pairs

    @property
    def attention_factor(self) -> float:
        """The scaling's attention factor, when all planes share one (``ValueError`` otherwise)."""
        if len(self._factors) != 1:
            raise ValueError(f"the axes have different attention factors {self._factors}")
        return self._factors[0]

    def frequencies(
        self, seq_len: int | Sequence[int] | None = None, *, t: float | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The frequency matrix ``F`` and the attention factor per plane, for a length (and a time).

        Args:
            seq_len: length per axis (or one for all) seen by length-dependent methods
                (:class:`~axial_rope.scaling.DynamicNTK`, :class:`~axial_rope.scaling.LongRoPE`);
                a rope built from a frequency model has none.
            t: sampling time (noise level in ``[0, 1]``), needed by time-dependent methods
                (:mod:`axial_rope.time_scaling`), ignored by the others.

        Returns:
            ``F`` float64 ``[n_axes, n_pairs]`` (per head ``[H, n_axes, n_pairs]``) and ``scale`` float64
            ``[n_pairs]``, on the CPU (with a time-dependent method, on ``t``'s device).
        """
        if self.spectrum == "custom":  # copies: the buffers must not alias the (immutable) model
            model = self.frequency_model
            scale = model.scale if model.scale is not None else torch.ones(model.n_pairs, dtype=torch.float64)
            return model.freqs.clone(), scale.clone()
        n_axes = len(self.axes_dim)
        lengths = _per_axis("seq_len", seq_len, n_axes, False) if seq_len is not None else (None,) * n_axes
        return spectrum_frequencies(self.axes_dim, self.theta, self.scaling, self.spectrum, lengths, t)

    def with_scaling(self, scaling: Scaling | None | Sequence[Scaling | None]) -> AxialRoPE:
        """The same rotary layout with another ``scaling`` (one method or one per axis), on this rope's device.

        Cheap (a few small float64 tensors), so models build it per call instead of caching
        ropes: ``rope.with_scaling(ar.positions_for_size(...).scaling)``. An all-``None``
        scaling equal to this rope's returns ``self``.
        """
        if self.learned_freqs is not None:
            raise ValueError("with_scaling needs fixed frequencies; this rope learns its own (learnable=True)")
        per_axis = tuple(
            _scaling_method(s) for s in _per_axis("scaling", scaling, self.n_axes, self.spectrum != "per_axis")
        )
        if per_axis == self.scaling:
            return self
        if self.spectrum == "custom":
            raise ValueError("with_scaling needs a spectrum (axes_dim, theta); this rope has a frequency model")
        theta = self.theta if self.spectrum == "per_axis" else self.theta[0]
        scaling = per_axis if self.spectrum == "per_axis" else per_axis[0]
        rope = AxialRoPE(self.axes_dim, theta, scaling, self.pairing, self.spectrum, backend=self.backend)
        return rope.to(self.freqs.device)

    def _apply(self, fn, recurse=True):
        # .half() / .to(dtype) must not round the frequencies: the float64 buffers are
        # rebuilt on the new device and a learned F keeps its float32 values.
        learned = None if self.learned_freqs is None else self.learned_freqs.data
        super()._apply(fn, recurse)
        freqs, scale = self.frequencies(t=1.0 if self.time_dependent else None)
        device = self.freqs.device
        self.freqs, self.scale = freqs.to(device), scale.to(device)
        if learned is not None and self.learned_freqs.dtype != learned.dtype:
            self.learned_freqs.data = learned.to(self.learned_freqs.device)
        return self

    # -- positions -----------------------------------------------------------------

    def _positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Check ``pos`` and return it as ``[B|1, S, n_axes]`` (see :func:`check_positions`), position map applied."""
        if not isinstance(pos, torch.Tensor):
            raise TypeError(f"pos must be a torch.Tensor, got {type(pos).__name__}")
        check_positions(pos)
        if pos.ndim == 1 and self.n_axes == 1:
            pos = pos[:, None]
        if pos.ndim not in (2, 3) or pos.shape[-1] != self.n_axes:
            expected = (
                "[S], [S, 1] or [B, S, 1]" if self.n_axes == 1 else f"[S, {self.n_axes}] or [B, S, {self.n_axes}]"
            )
            raise ValueError(f"pos must be {expected} for {self.n_axes} axes, got shape {tuple(pos.shape)}")
        pos = pos if pos.ndim == 3 else pos[None]
        return pos if self.transform is None else self.transform(pos)  # float64 after the position map

    def at_time(self, t: float | torch.Tensor) -> AxialRoPE | TimedRoPE:
        """This rope at sampling time ``t``, ``F(t)`` computed once: it takes a rope's calls without ``t`` (``rope=``
        of :class:`~axial_rope.Attention`, ``DiTBlock``). A rope without a time-dependent method returns itself."""
        return TimedRoPE(self, t) if self.time_dependent else self

    def _freqs_for(self, pos: torch.Tensor, seq_len, t=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.learned_freqs is not None:
            return self.learned_freqs, (self.scale if self.scaled else None)
        if isinstance(t, TimeFrequencies):  # bound by at_time(t): computed once per step
            return t
        if not self.length_dependent and not self.time_dependent:
            return self.freqs, (self.scale if self.scaled else None)
        if self.length_dependent and seq_len is None:  # the length seen, per axis (a host sync: pass seq_len)
            seq_len = tuple(int(v) + 1 for v in pos.flatten(0, -2).amax(0).tolist())
        if self.time_dependent:  # torch ops on t: one compiled graph for every step
            return frequencies_at(self, t, seq_len)
        freqs, scale = self.frequencies(seq_len)
        return freqs.to(pos.device), (scale.to(pos.device) if bool((scale != 1).any()) else None)

    # -- tables and rotation -------------------------------------------------------

    def cos_sin(
        self,
        pos: torch.Tensor,
        *,
        seq_len: int | Sequence[int] | None = None,
        with_attention_factor: bool = True,
        t: float | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables in the pairing's channel layout, attention factor multiplied in.

        Args:
            pos: ``[S, n_axes]`` or ``[B, S, n_axes]`` (1-D RoPE: ``[S]`` too).
            with_attention_factor: multiply the scaling's attention factor in (``False``: unit rotation,
                for callers that put the factor into the softmax scale instead).
            t: sampling time for a time-dependent scaling (see :meth:`forward`).

        Returns:
            float32 ``cos``, ``sin`` of shape ``[..., S, rot_dim]`` (``pos``'s leading dims);
            per-head learned frequencies give ``[..., S, H, rot_dim]``.
        """
        batched = isinstance(pos, torch.Tensor) and pos.ndim == 3
        pos3 = self._positions(pos)
        freqs, scale = self._freqs_for(pos3, seq_len, t)
        cos, sin = plane_cos_sin(pos3, freqs, scale if with_attention_factor else None, torch.float32)
        cos, sin = channel_table(cos, self.pairing), channel_table(sin, self.pairing)
        return (cos, sin) if batched else (cos[0], sin[0])

    def _prepare(self, q, k, pos, layout, seq_len, with_attention_factor, t):
        """Check q, k and pos together; returns pos ``[B|1, S, n_axes]``, F and the plane scale."""
        check_qk(q, k, layout)
        if q.shape[-1] < self.rot_dim:
            raise ValueError(f"head_dim {q.shape[-1]} is smaller than rot_dim = {self.rot_dim} (2 x the planes of F)")
        pos = self._positions(pos)
        s = seq_dim(layout)
        if pos.shape[1] != q.shape[s]:
            raise ValueError(f"pos has {pos.shape[1]} positions, q has S={q.shape[s]} tokens (layout={layout!r})")
        if pos.shape[0] not in (1, q.shape[0]):
            raise ValueError(f"pos batch {pos.shape[0]} must be 1 or q's batch {q.shape[0]}")
        freqs, scale = self._freqs_for(pos, seq_len, t)
        if freqs.ndim == 3:
            heads = [t.shape[3 - s] for t in (q, k) if t is not None]
            if any(h != freqs.shape[0] for h in heads):
                raise ValueError(f"per-head frequencies are for {freqs.shape[0]} heads, q/k have {heads} heads")
        return pos, freqs, (scale if with_attention_factor else None)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        pos: torch.Tensor,
        layout: str = "bshd",
        *,
        seq_len: int | Sequence[int] | None = None,
        backend: str | None = None,
        with_attention_factor: bool = True,
        inplace: bool = False,
        t: float | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotate queries and keys.

        Args:
            q: ``[B, S, H, D]`` (``layout="bshd"``) or ``[B, H, S, D]`` (``"bhsd"``).
            k: same layout, ``H_k`` heads dividing ``H`` (grouped-query attention), or ``None``.
            pos: ``[S, n_axes]`` or per-sample ``[B, S, n_axes]`` (1-D: ``[S]`` too).
            seq_len: length per axis for length-dependent scaling (default: ``max(pos) + 1``).
            backend: overrides the module's backend for this call.
            with_attention_factor: ``False`` rotates without the scaling's attention factor.
            inplace: write the results into ``q`` and ``k`` (no output allocation when no
                gradient is recorded; see :func:`axial_rope.ops.rotate_qk`).
            t: sampling time of a time-dependent scaling (:mod:`axial_rope.time_scaling`): the noise
                level in ``[0, 1]`` (1 = pure noise), a number, a 0-d tensor or ``[B]`` equal entries;
                a tensor under ``torch.compile`` (no recompilation per step). Ignored by other ropes.

        Returns:
            ``(q, k)`` rotated, same shapes and dtypes.
        """
        pos, freqs, scale = self._prepare(q, k, pos, layout, seq_len, with_attention_factor, t)
        return rotate_qk(q, k, pos, freqs, scale, self.pairing, layout, backend or self.backend, inplace)

    def norm_and_rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        pos: torch.Tensor,
        q_weight: torch.Tensor | None = None,
        k_weight: torch.Tensor | None = None,
        layout: str = "bshd",
        *,
        eps: float = 1e-6,
        seq_len: int | Sequence[int] | None = None,
        backend: str | None = None,
        with_attention_factor: bool = True,
        t: float | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head QK-RMSNorm (weights ``[D]``, or ``None``) then rotation; one fused launch on Triton.

        Same arguments as :meth:`forward`; the norm runs over the whole head (``D``
        channels) in float32 and the result is rounded to the input dtype once.
        """
        pos, freqs, scale = self._prepare(q, k, pos, layout, seq_len, with_attention_factor, t)
        if k is None:
            raise ValueError("norm_and_rotate needs k; use forward() for q alone")
        for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
            if w is not None and tuple(w.shape) != (q.shape[-1],):
                raise ValueError(f"{name} must have shape [head_dim] = [{q.shape[-1]}], got {tuple(w.shape)}")
        return norm_rotate_qk(
            q, k, q_weight, k_weight, eps, pos, freqs, scale, self.pairing, layout, backend or self.backend
        )

    def apply(self, x: torch.Tensor, pos: torch.Tensor | None = None, layout: str = "bshd", **kwargs) -> torch.Tensor:
        """Rotate one tensor (queries or keys alone); same arguments as :meth:`forward`.

        The name shadows ``nn.Module.apply(fn)``, which ``model.apply(init_fn)`` calls on every
        submodule: a callable first argument without positions is passed on to it.
        """
        if pos is None and callable(x) and not isinstance(x, torch.Tensor):
            return super().apply(x)
        if pos is None:
            raise TypeError("AxialRoPE.apply(x, pos) needs pos, the coordinates of x's tokens")
        check_tensor("x", x, 4)
        return self.forward(x, None, pos, layout, **kwargs)[0]

    def extra_repr(self) -> str:
        learned = f", learnable={tuple(self.learned_freqs.shape)}" if self.learned_freqs is not None else ""
        if self.spectrum == "custom":
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
