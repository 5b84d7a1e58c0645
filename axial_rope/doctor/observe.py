"""What the doctor saw at one rotary site, and what it reads off it: tables, planes, pairing, frequencies.

A site is where a model hands its rotation to attention: a rotary module's ``(cos, sin)``, a diffusers
tables module's output, the :class:`~axial_rope.ops.Rotation` a model of this repository passes. An
:class:`Observation` holds what the site produced, the positions the records say it should rotate by, the
rope the records prescribe, and ``render``: the site's own structure computed from any rotation, so that the
prescribed rotation and every alternative explanation (:mod:`axial_rope.doctor.diagnose`) are compared with
what was seen in the same form. Where the structure is plane tables (``planes``: transformers, this
repository's models), the angles themselves are read off and fitted (:func:`fit_frequencies`); where q and k
were captured before and after the rotation, :func:`qk_rotation` reads the pairing the code applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..ops import rope_angles, rotation_tables
from ..ops.rotation import Rotation
from ..rope import AxialRoPE

__all__ = ["Observation", "QKFit", "fit_frequencies", "plane_render", "planes_of_tables", "qk_rotation",
           "residual", "table_bound", "unit_roundoff"]  # fmt: skip


TOKENS = 256  # tokens a frequency fit uses at most


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype`` at 1 (``2**-24`` for float32, ``2**-8`` for bfloat16)."""
    return torch.finfo(dtype).eps / 2


@dataclass
class QKFit:
    """The rotation read off q and k before and after a rotation function (:func:`qk_rotation`).

    Attributes:
        pairing: the pairing whose planes keep their norm, or ``None`` where neither does (or both: no angle).
        spread: per pairing, the largest relative change of a plane's norm ratio over tokens and heads (the
            rotation of the right pairing changes it by rounding only; the wrong one by O(1)).
        factor: the attention factor, the median norm ratio of the planes (under ``pairing``).
        angles: float64 ``[B, S, n]``, the turn of each plane per token (under ``pairing``), or ``None``.
        untouched: the largest change of the channels past the rotary width (0 when they pass through).
    """

    pairing: str | None
    spread: dict[str, float]
    factor: float
    angles: torch.Tensor | None
    untouched: float


@dataclass
class Observation:
    """One call of a rotary site: what it produced and what the records prescribe for it.

    Attributes:
        site: where (a module name, with the call and the pass: ``"model.rotary_emb"``).
        rope: the rope the records prescribe for the site (:func:`axial_rope.rope_from_config`, a family record).
        pos: float64 ``[B|1, S, A]``, the positions as the caller meant them (an offset ``position_ids`` the doctor
            passed, not what a faulty model made of it), before the rope's position map.
        prescribed: the rotation the records prescribe at ``pos`` (``rope.rotation(pos, scaling=scaling)``).
        observed: the site's structure as captured, float64 (complex128) copies.
        dtype: the floating dtype the site produced.
        render: a rotation -> the site's structure (float64), comparable with ``observed``.
        planes: ``(cos, sin)`` float64 ``[B, S, n]`` plane tables read off the site, where its structure is
            plane tables (``None``: a structure the doctor compares only through ``render``).
        width: the site's rotary channels where they can be read (``2 n`` of ``planes``), else ``None``.
        qk: the rotation read off q and k around the rotation function (``None``: not captured).
        autocast: whether the call ran under ``torch.autocast`` (the doctor's second pass).
        learned: the frequencies are the model's weights (no spectrum to re-derive alternatives from).
        layout: how the tables were laid out, in words (``"rotate_half"``, ``"interleaved"``, ``"complex"``).
        positions_passed: whether ``pos`` are positions the doctor (or the caller) passed to the model.
        wrap: the structure holds angles, not cos/sin (compared modulo 2 pi).
        sample: q ``[B, S, H, D]`` and k ``[B, S, H_k, D]`` before the rotation (for the extrapolation map's
            attention entropy and phase concentration), or ``None``.
        scaling: the scaling of this call where the records size it per call (``None``: the rope's own).
        sign: ``-1`` where the convention turns by minus its tables' angle (the tables stay stock's).
        notes: what the source could not read (said in the report).
    """

    site: str
    rope: AxialRoPE
    pos: torch.Tensor
    prescribed: Rotation
    observed: list[torch.Tensor]
    dtype: torch.dtype
    render: Callable[[Rotation], list[torch.Tensor]]
    planes: tuple[torch.Tensor, torch.Tensor] | None = None
    width: int | None = None
    qk: QKFit | None = None
    autocast: bool = False
    learned: bool = False
    layout: str = ""
    positions_passed: bool = False
    wrap: bool = False
    sample: tuple[torch.Tensor, torch.Tensor] | None = None
    scaling: tuple | None = None
    sign: int = 1
    notes: list[str] = field(default_factory=list)

    def error(self, rotation: Rotation) -> float:
        """The largest difference between what the site produced and ``rotation`` rendered in its structure."""
        return residual(self.observed, self.render(rotation), wrap=self.wrap)

    @property
    def angles(self) -> torch.Tensor:
        """The prescribed angle of every plane as the tables carry it, float64 ``[B|1, S, n]`` (per head
        ``[B|1, S, H, n]``)."""
        return rope_angles(self.prescribed.pos, self.prescribed.freqs * self.sign)

    @property
    def amplitude(self) -> float:
        factor = self.prescribed.attention_factor
        return 1.0 if factor is None else float(factor.abs().max())


def plane_render(sign: int = 1) -> Callable[[Rotation], list[torch.Tensor]]:
    """The render of a site whose structure is plane tables: ``[cos, sin]`` float64 ``[B|1, S, n]``, turned by
    ``sign`` times the angle (a convention that rotates by minus its tables' angle keeps stock tables)."""

    def render(rotation: Rotation) -> list[torch.Tensor]:
        cos, sin = rotation_tables(rotation._replace(freqs=rotation.freqs * sign, turns=None), torch.float64)
        return [cos, sin]

    return render


def planes_of_tables(cos: torch.Tensor, sin: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Plane tables ``[..., n]`` and the layout's name from a site's tables: complex ``freqs_cis`` (``sin`` None),
    or channel tables ``[..., r]`` whose two copies of each plane sit side by side (``"interleaved"``) or half a
    width apart (``"rotate_half"``). A table that repeats neither way is read as rotate_half (``"unpaired"``)."""
    if sin is None:
        planes = cos.to(torch.complex128)
        return planes.real, planes.imag, "complex"
    cos, sin = cos.double(), sin.double()
    half = cos.shape[-1] // 2
    if torch.equal(cos[..., :half], cos[..., half:]) and torch.equal(sin[..., :half], sin[..., half:]):
        return cos[..., :half], sin[..., :half], "rotate_half"
    if torch.equal(cos[..., 0::2], cos[..., 1::2]) and torch.equal(sin[..., 0::2], sin[..., 1::2]):
        return cos[..., 0::2], sin[..., 0::2], "interleaved"
    return cos[..., :half], sin[..., :half], "unpaired"


def residual(observed: list[torch.Tensor], rendered: list[torch.Tensor], *, wrap: bool = False) -> float:
    """The largest difference between two structures (complex: its modulus; ``wrap``: angles, compared modulo
    2 pi); ``inf`` where they do not line up."""
    if len(observed) != len(rendered):
        return float("inf")
    worst = 0.0
    for a, b in zip(observed, rendered):
        # equal shapes, but for the batch: one table for the whole batch stands for a table per sample
        if a.ndim != b.ndim or (a.ndim and (a.shape[1:] != b.shape[1:] or 1 not in (a.shape[0], b.shape[0])
                                            and a.shape[0] != b.shape[0])):  # fmt: skip
            return float("inf")
        diff = a - b.to(a.dtype)
        diff = (torch.remainder(diff + torch.pi, 2 * torch.pi) - torch.pi if wrap else diff).abs()
        if diff.numel():
            value = float(diff.max())
            worst = max(worst, value if value == value else float("inf"))  # NaN: no match
    return worst


def table_bound(obs: Observation, angle_dtype: torch.dtype = torch.float32) -> float:
    """How far a healthy site's tables may sit from the float64 ones: angles computed in ``angle_dtype``.

    A stock table is ``a * cos(phi~)`` rounded to the site's dtype, with ``phi~`` the angle from positions and
    inverse frequencies each rounded to ``angle_dtype`` and their product rounded once more: ``|phi~ - phi| <=
    3 u |phi|`` (``u`` its unit roundoff; positions made by a float32 ``linspace`` or a scale add one more ``u``);
    ``cos``/``sin`` and the factor's product add ``2 u`` (absolute), the cast to the site's dtype ``u_site``.
    The bound takes four times that (per-axis angles summed, float32 ``arange`` arithmetic upstream), at the
    largest prescribed angle: ``a (4 u (4 |phi|max + 2) + 2 u_site)``.
    """
    u = unit_roundoff(angle_dtype)
    angles = obs.angles
    phi = float(angles.abs().max()) if angles.numel() else 0.0
    return obs.amplitude * (4 * u * (4 * phi + 2) + 2 * unit_roundoff(obs.dtype))


def qk_rotation(before: torch.Tensor, after: torch.Tensor, width: int) -> QKFit:
    """The rotation a function applied, read off q (and k) ``[B, S, H, D]`` before and after it.

    Under the right pairing every plane of the first ``width`` channels keeps its norm up to the attention
    factor, whatever the angle; under the wrong one, the two channels of a "plane" belong to different planes
    and their joint norm changes by O(1) wherever the angles differ. Tokens where a plane is near zero are left
    out (its ratio is rounding).
    """
    before, after = before.double(), after.double()
    untouched = float((after[..., width:] - before[..., width:]).abs().max()) if after.shape[-1] > width else 0.0
    spread, fits = {}, {}
    n = width // 2
    for pairing in ("half", "interleaved"):
        if pairing == "interleaved":
            zb = torch.complex(before[..., 0:width:2], before[..., 1:width:2])
            za = torch.complex(after[..., 0:width:2], after[..., 1:width:2])
        else:
            zb = torch.complex(before[..., :n], before[..., n:width])
            za = torch.complex(after[..., :n], after[..., n:width])
        norm = zb.abs()
        keep = norm > 1e-3 * norm.mean()
        ratio = torch.where(keep, za.abs() / norm.clamp_min(1e-300), torch.nan)  # [B, S, H, n]
        factor = ratio.flatten(0, -2).nanmedian(0).values  # [n]
        spread[pairing] = float(((ratio - factor).abs() / factor.clamp_min(1e-300)).nan_to_num(0.0).max())
        turn = za * zb.conj()  # plane's turn times |zb|^2: heads summed by their weight
        fits[pairing] = (float(factor.nanmedian()), torch.angle(turn.sum(-2)))  # [B, S, n]
    best = min(spread, key=spread.get)
    other = max(spread, key=spread.get)
    # the right pairing keeps norms to rounding; both keeping them means no plane turned (no evidence)
    decided = spread[best] < 0.05 and spread[other] > 10 * max(spread[best], 1e-6)
    pairing = best if decided else None
    factor, angles = fits[best]
    return QKFit(pairing, spread, factor, angles if decided else None, untouched)


def fit_frequencies(angles: torch.Tensor, pos: torch.Tensor, rounds: int = 4) -> torch.Tensor:
    """Per-plane frequencies ``F`` ``[A, n]`` that explain wrapped angles ``[B, S, n]`` at positions ``[B|1, S, A]``.

    Multi-scale unwrapping: the wrapped angle differences of tokens one smallest step apart (per axis) give a
    first ``F`` (a plane turns less than pi per step for every theta-based spectrum), which unwraps the angles of
    tokens further apart, refitted by least squares over all tokens (no intercept: the angle at position 0 is 0).
    An axis the positions never move alone (M-RoPE text: every axis equal) is fitted jointly with the others
    (least squares' minimum-norm answer), so only a sum of those axes' columns is identified.
    """
    n, batch = angles.shape[-1], max(angles.shape[0], pos.shape[0])
    keep = -(-TOKENS // batch)  # the first tokens of each row: their unit steps stay (pairs cost T^2 memory)
    pos = pos.double().expand(batch, -1, -1)[:, :keep].reshape(-1, pos.shape[-1])  # [T, A]
    phi = angles.double().expand(batch, -1, -1)[:, :keep].reshape(-1, n)  # [T, n]
    diff_pos = pos[:, None, :] - pos[None, :, :]  # [T, T, A]
    diff_phi = torch.remainder(phi[:, None, :] - phi[None, :, :] + torch.pi, 2 * torch.pi) - torch.pi  # [T, T, n]
    span = diff_pos.abs().amax((0, 1))
    step = torch.stack([d[d > 0].min() if (d > 0).any() else torch.ones((), dtype=d.dtype)
                        for d in diff_pos.abs().unbind(-1)])  # fmt: skip
    close = (diff_pos.abs() <= step * 1.01).all(-1) & (diff_pos.abs().sum(-1) > 0)
    design, target = diff_pos[close], diff_phi[close]  # [P, A], [P, n]
    if design.shape[0] == 0:
        return torch.zeros(pos.shape[-1], n, dtype=torch.float64)
    freqs = torch.linalg.lstsq(design, target, driver="gelsd").solution  # [A, n]
    for _ in range(rounds):
        guess = pos @ freqs
        unwrapped = guess + torch.remainder(phi - guess + torch.pi, 2 * torch.pi) - torch.pi
        freqs = torch.linalg.lstsq(pos, unwrapped, driver="gelsd").solution
    return freqs * (span > 0)[:, None]
