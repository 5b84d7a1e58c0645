"""FoPE, Fourier Position Embedding (Hua et al. 2025, arXiv 2412.17739): per-head tables mixing the frequencies.

RoPE gives plane ``d`` one frequency. FoPE makes each plane a Fourier series of the head's frequencies and drops
the frequencies too low to complete a period within the training length, which the model cannot learn
("zero-out the destructive frequency components"). The served form (vLLM ``model_executor/layers/
rotary_embedding/fope.py``, SGLang's ``FourierRotaryEmbedding``) is, for key head ``h`` and position ``p``:

    omega_D = theta ** (-2D / r),  kept if omega_D > 2 pi / L  (or the first ``num_inv_freq``),  D < m
    cos_table[p, h, d] = sum_D cos(p omega_D) C_cos[h, D, d]        d < m
    sin_table[p, h, d] = sum_D sin(p omega_D) C_sin[h, D, d]
    planes d >= m: cos 1, sin 0 (a zero frequency: they pass through unturned)

and q and k turn as by RoPE tables, ``(x1, x2) -> (x1 c - x2 s, x2 c + x1 s)``, but with these unnormalised
``(c, s)``. ``C_cos``, ``C_sin`` ``[H_kv, m, m]`` are learned per key head (query head ``h`` reads key head
``h // (H / H_kv)``); identity coefficients give RoPE with the low frequencies clipped. The FoPE training code
initialises them as the identity plus Gaussian noise (its "eye_norm" init; SGLang names the noise
``fope_init_factor``, 0.1 by default).

A table is not a rotation (``(c, s)`` is not a unit turn, and its logits are not a function of ``p_q - p_k``
alone once ``C`` mixes frequencies), so FoPE goes through :func:`axial_rope.apply_rope`'s per-head tables, not
through a :class:`~axial_rope.ops.rotation.Rotation`; a rolling cache cannot re-index it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..ops import PAIRINGS, apply_rope, channel_table, check_choice, has_float64
from ..scaling import inv_freq

__all__ = ["FourierRoPE", "fope_inv_freq"]


def fope_inv_freq(
    rot_dim: int, theta: float = 10000.0, *, max_position_embeddings: int | None = None, num_inv_freq: int | None = None
) -> torch.Tensor:
    """The frequencies FoPE keeps: RoPE's ``theta ** (-2D / rot_dim)`` above ``2 pi / max_position_embeddings``
    (a full period within the training length), or the first ``num_inv_freq``. float64 ``[m]``, highest first."""
    inv, _ = inv_freq(rot_dim, theta)  # float64 [rot_dim / 2], decreasing
    if (max_position_embeddings is None) == (num_inv_freq is None):
        raise ValueError(
            "pass exactly one of max_position_embeddings (clip by period) and num_inv_freq (keep the first)"
        )
    if num_inv_freq is not None:
        if isinstance(num_inv_freq, bool) or not isinstance(num_inv_freq, int) or not 0 < num_inv_freq <= len(inv):
            raise ValueError(f"num_inv_freq must be an int in [1, {len(inv)}], got {num_inv_freq!r}")
        return inv[:num_inv_freq]
    L = max_position_embeddings
    if isinstance(L, bool) or not isinstance(L, int) or L <= 0:
        raise ValueError(f"max_position_embeddings must be a positive int, got {L!r}")
    kept = inv[inv > 2 * math.pi / L]
    if kept.numel() == 0:
        raise ValueError(f"max_position_embeddings={L} keeps no frequency of theta={theta} (all periods exceed it)")
    return kept


class FourierRoPE(nn.Module):
    """FoPE's per-head cos/sin tables over one position axis, with learned coefficients.

    Args:
        rot_dim: rotated channels per head (even); ``rot_dim / 2`` planes, of which the ``m`` kept frequencies mix.
        num_kv_heads: ``H_kv``, heads with their own coefficients (key heads; query heads share their group's).
        theta: RoPE's base.
        max_position_embeddings: the training length ``L``: frequencies with a period longer than ``L`` are
            dropped (or pass ``num_inv_freq``, the number kept).
        pairing: ``"half"`` (vLLM's, neox) or ``"interleaved"``.
        init_std: the Gaussian noise added to the identity coefficients at initialisation.
        backend: the backend of :func:`axial_rope.apply_rope`.

    Attributes:
        cos_coef, sin_coef: float32 ``[H_kv, m, m]`` parameters, the names and shapes of FoPE checkpoints.
        inv_freq: float64 ``[m]`` buffer, the kept frequencies (float32 on a device without float64).
    """

    def __init__(
        self,
        rot_dim: int,
        num_kv_heads: int,
        theta: float = 10000.0,
        *,
        max_position_embeddings: int | None = None,
        num_inv_freq: int | None = None,
        pairing: str = "half",
        init_std: float = 0.1,
        backend: str | None = None,
    ):
        super().__init__()
        if isinstance(rot_dim, bool) or not isinstance(rot_dim, int) or rot_dim <= 0 or rot_dim % 2:
            raise ValueError(f"rot_dim must be a positive even int, got {rot_dim!r}")
        if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int) or num_kv_heads <= 0:
            raise ValueError(f"num_kv_heads must be a positive int, got {num_kv_heads!r}")
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or not 0 <= init_std < math.inf:
            raise ValueError(f"init_std must be a finite number >= 0, got {init_std!r}")
        check_choice("pairing", pairing, PAIRINGS)
        with torch.device("cpu"):  # the frequencies from the arguments, also under a meta default device
            kept = fope_inv_freq(rot_dim, theta, max_position_embeddings=max_position_embeddings,
                                 num_inv_freq=num_inv_freq)  # fmt: skip
        self.rot_dim, self.pairing, self.init_std, self.backend = rot_dim, pairing, float(init_std), backend
        self.n_pairs, self.n_kept = rot_dim // 2, kept.numel()
        self._kept = kept  # CPU float64: the buffer is recomputed from it after every move
        m = self.n_kept
        self.register_buffer("inv_freq", kept.to(torch.get_default_device()), persistent=False)
        self.cos_coef = nn.Parameter(torch.empty(num_kv_heads, m, m))
        self.sin_coef = nn.Parameter(torch.empty(num_kv_heads, m, m))
        if self.cos_coef.device.type != "meta":
            self.reset_parameters()

    @property
    def num_kv_heads(self) -> int:
        return self.cos_coef.shape[0]

    @classmethod
    def from_coefficients(
        cls, cos_coef: torch.Tensor, sin_coef: torch.Tensor, rot_dim: int, theta: float = 10000.0, **kwargs
    ) -> FourierRoPE:
        """A FoPE loaded from a checkpoint's coefficients ``[H_kv, m, m]`` (vLLM's and SGLang's ``cos_coef`` and
        ``sin_coef``); ``m`` must be the number of frequencies ``max_position_embeddings`` or ``num_inv_freq``
        keeps (``kwargs`` as the constructor's)."""
        for name, c in (("cos_coef", cos_coef), ("sin_coef", sin_coef)):
            if not isinstance(c, torch.Tensor) or c.ndim != 3 or c.shape[1] != c.shape[2]:
                got = tuple(c.shape) if isinstance(c, torch.Tensor) else type(c).__name__
                raise ValueError(f"{name} must be [H_kv, m, m] coefficients, got {got}")
        if cos_coef.shape != sin_coef.shape:
            raise ValueError(f"cos_coef {tuple(cos_coef.shape)} and sin_coef {tuple(sin_coef.shape)} differ in shape")
        fope = cls(rot_dim, cos_coef.shape[0], theta, init_std=0.0, **kwargs)
        if fope.n_kept != cos_coef.shape[1]:
            raise ValueError(
                f"the coefficients mix m={cos_coef.shape[1]} frequencies, the arguments keep {fope.n_kept}: "
                "pass the checkpoint's max_position_embeddings or num_inv_freq"
            )
        fope.load_state_dict({"cos_coef": cos_coef, "sin_coef": sin_coef})
        return fope

    def reset_parameters(self) -> None:
        """Identity coefficients plus ``N(0, init_std**2)`` noise (FoPE's "eye_norm" init); draws from the global
        generator, cos before sin."""
        eye = torch.eye(self.n_kept, device=self.cos_coef.device).expand_as(self.cos_coef)
        with torch.no_grad():
            for coef in (self.cos_coef, self.sin_coef):
                coef.normal_(0.0, self.init_std) if self.init_std > 0 else coef.zero_()
                coef.add_(eye)

    def _apply(self, fn, recurse=True):
        # the frequencies are recomputed on the new device from the CPU float64 copy (a .half() or .to(dtype) must not
        # round them), moved as a float32 stand-in first: a device without float64 (MPS) keeps them in float32
        self.inv_freq = self.inv_freq.float()
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        self.inv_freq = self._kept.to(device, torch.float64 if has_float64(device) else torch.float32)
        return self

    def plane_tables(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """FoPE's cos and sin per plane ``[B|1, S, H_kv, n]`` (float32) at positions ``pos`` ``[S]`` or ``[B, S]``."""
        if not isinstance(pos, torch.Tensor) or pos.ndim not in (1, 2):
            got = f"{pos.dtype} {tuple(pos.shape)}" if isinstance(pos, torch.Tensor) else type(pos).__name__
            raise ValueError(f"pos must be [S] or [B, S] positions (one axis), got {got}")
        pos = pos if pos.ndim == 2 else pos[None]
        angle = pos.to(self.inv_freq.dtype)[..., None] * self.inv_freq  # [B|1, S, m], float64 products
        coef = self.cos_coef.dtype
        cos = torch.einsum("bsD,hDd->bshd", angle.cos().to(coef), self.cos_coef)  # [B|1, S, H_kv, m]
        sin = torch.einsum("bsD,hDd->bshd", angle.sin().to(coef), self.sin_coef)
        pad = self.n_pairs - self.n_kept  # clipped planes: zero frequency, cos 1 and sin 0
        cos = torch.nn.functional.pad(cos, (0, pad), value=1.0)
        sin = torch.nn.functional.pad(sin, (0, pad), value=0.0)
        return cos, sin

    def cos_sin(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Channel tables ``[B|1, S, H_kv, rot_dim]`` in the pairing's layout, for :func:`axial_rope.apply_rope`."""
        return tuple(channel_table(t, self.pairing) for t in self.plane_tables(pos))

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, layout: str = "bshd"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[B, S, H, D]`` and k ``[B, S, H_kv', D]`` (``bshd``; or ``bhsd``) turned by the tables at ``pos``;
        ``H_kv`` divides both head counts (query head ``h`` reads table head ``h // (H / H_kv)``)."""
        cos, sin = self.cos_sin(pos)
        return (
            apply_rope(q, cos, sin, self.pairing, layout, self.backend),
            apply_rope(k, cos, sin, self.pairing, layout, self.backend),
        )

    def extra_repr(self) -> str:
        return (
            f"rot_dim={self.rot_dim}, num_kv_heads={self.num_kv_heads}, kept={self.n_kept}/{self.n_pairs}, "
            f"pairing={self.pairing!r}"
        )
