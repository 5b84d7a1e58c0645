"""Checks of token coordinates shared by the rotary layers (:func:`check_positions`)."""

from __future__ import annotations

import torch

__all__ = ["check_positions"]


def check_positions(pos: torch.Tensor) -> None:
    """Refuse coordinates that cannot be exact, and NaN or inf, without a host sync where it matters.

    Position dtypes and their exact range: integer dtypes hold every integer they
    represent; float32 holds integers up to ``2**24`` (and fractions on a coarser grid
    as they grow: spacing ``2**-23 |p|``); float64 integers up to ``2**53``. float16
    and bfloat16 are refused: they round integers past 2048 (float16) or 256
    (bfloat16), e.g. 257 becomes 256.
    Angles are float64 products, exact to ``|angle| * 2**-53`` radians (1e-7 rad at an
    angle of 1e9), so float64 positions keep relative invariance far past any real length.

    The NaN/inf check: eager CPU tensors raise ``ValueError`` here; compiled code and GPU
    tensors use ``torch._assert_async`` (a ``RuntimeError`` when it fires), which keeps the
    check inside compiled graphs and never waits for the GPU (no device-to-host sync; on
    CUDA it is a device-side assert).
    """
    if pos.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"pos must be float32, float64 or an integer dtype, got {pos.dtype}, which rounds coordinates "
            "(257 becomes 256 in bfloat16); build positions in float32 (ar.grid's default) or float64"
        )
    if (
        pos.dtype == torch.bool
        or pos.is_complex()
        or not (pos.is_floating_point() or pos.dtype.is_signed or pos.dtype == torch.uint8)
    ):
        raise TypeError(f"pos must hold real float or int coordinates, got dtype {pos.dtype}")
    if not pos.is_floating_point():
        return
    if pos.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool(torch.isfinite(pos).all()):
            raise ValueError("pos holds NaN or inf coordinates")
    else:
        torch._assert_async(torch.isfinite(pos).all(), "axial_rope: pos holds NaN or inf coordinates")
