"""The extrapolation map as one picture: per axis, each plane's wavelength against the trained and planned extents.

matplotlib (Agg backend) is imported here only, when a picture is asked for.
"""

from __future__ import annotations

import math

__all__ = ["draw"]

MARKERS = {"interpolate": "v", "ntk": "^", "yarn": "s", "config": "D", "auto": "P", "observed": "x", "none": "o"}


def draw(extrapolation, path: str, title: str = "") -> str:
    """Draw ``extrapolation`` (an :class:`~axial_rope.doctor.extrapolation.ExtrapolationMap`) to ``path`` (PNG).

    One panel per axis: the planes (x, by wavelength) and their wavelength in tokens (y, log scale); a line at
    the trained extent and, dashed, the planned one. Planes above the trained line never turned once in training.
    With a planned size, each method's wavelengths (positions interpolation folded in) are the small markers.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    axes = extrapolation.axes
    fig, panels = plt.subplots(1, len(axes), figsize=(max(6.0, 4.6 * len(axes)), 4.0), squeeze=False)
    for panel, axis in zip(panels[0], axes):
        order = sorted(range(len(axis.wavelengths)), key=lambda j: axis.wavelengths[j])
        finite = [axis.wavelengths[j] for j in order]
        xs = list(range(len(order)))
        colours = ["tab:red" if w > axis.trained else "tab:blue" for w in finite]
        panel.scatter(xs, [min(w, 1e12) for w in finite], c=colours, s=36, zorder=3, label="trained spectrum")
        for name, info in axis.methods.items():
            waves = info.get("wavelengths") or []
            if name == "none" or not waves:
                continue
            ys = [min(waves[j], 1e12) for j in order]
            style = (
                {"color": "black", "s": 30, "zorder": 4} if name == "observed" else {"s": 14, "alpha": 0.7, "zorder": 2}
            )
            panel.scatter(xs, ys, marker=MARKERS.get(name, "x"), label=name, **style)
        panel.axhline(axis.trained, color="black", lw=1.2, label=f"trained ({axis.trained})")
        if axis.planned is not None:
            panel.axhline(axis.planned, color="black", lw=1.2, ls="--", label=f"planned ({axis.planned})")
        panel.set_yscale("log")
        panel.set_xlabel("plane (by wavelength)")
        panel.set_ylabel("wavelength 2 pi / F (tokens)")
        beyond = sum(w > axis.trained for w in finite if not math.isinf(w))
        panel.set_title(f"axis {axis.name}: {beyond} of {len(finite)} planes beyond training", fontsize=10)
        panel.grid(True, which="both", alpha=0.2)
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
    panels[0][-1].legend(fontsize=7, loc="upper left", framealpha=0.85)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
