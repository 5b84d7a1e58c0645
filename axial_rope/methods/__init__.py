"""Position methods published since 2025, as presets on the rotation contract (:mod:`axial_rope.ops.rotation`).

Each module is one method, checked in the tests against its paper's formula transcribed independently:

- :mod:`~axial_rope.methods.untwisting`: Untwisting RoPE (arXiv 2602.05013), the reference image's keys with
  their high-frequency planes damped on a timestep schedule (a key-side per-token factor);
- :mod:`~axial_rope.methods.crpa`: CRPA (arXiv 2511.19778), keys placed on the query's stride (key positions);
- :mod:`~axial_rope.methods.xpos`: xPos (arXiv 2212.10554), opposite per-token decays on q and k;
- :mod:`~axial_rope.methods.fope`: FoPE (arXiv 2412.17739), per-head tables mixing the frequencies with learned
  coefficients, the under-trained ones clipped;
- :mod:`~axial_rope.methods.lol`: LoL (arXiv 2601.16914), a RoPE base per head (a fixed per-head ``F``), and the
  diagnostics of sink collapse (each head's phase alignment with the sinks, the heads' phase concentration).
"""

from .crpa import crpa_positions, crpa_rotation, grid_coordinates
from .fope import FourierRoPE, fope_inv_freq
from .lol import lol_frequencies, lol_jitter, lol_rope, phase_concentration, sink_alignment
from .untwisting import Untwisting, frequency_bands
from .xpos import XPosKey, XPosRotation, xpos_rotation, xpos_zeta

__all__ = [
    "FourierRoPE",
    "Untwisting",
    "XPosKey",
    "XPosRotation",
    "crpa_positions",
    "crpa_rotation",
    "fope_inv_freq",
    "frequency_bands",
    "grid_coordinates",
    "lol_frequencies",
    "lol_jitter",
    "lol_rope",
    "phase_concentration",
    "sink_alignment",
    "xpos_rotation",
    "xpos_zeta",
]
