"""Relative invariance far from the origin: a naive RoPE beside axial_rope.

``python -m scripts.rope_check`` scores one random query against one random key
(width 64, theta 10000), the key 4 positions before the query. RoPE makes the
score depend on that distance only, so positions (1,000,007; 1,000,003) must
score like (7; 3); the control pair (107; 3) is 100 positions apart and must not.
A naive implementation computes the angles in the input dtype and loses this; axial_rope keeps it with
float64 angles and, on devices without float64, with fixed-point turns (``angles="turns"``, also shown).
"""

from __future__ import annotations

import argparse

import torch

import axial_rope as ar

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
PAIRS = {"near (7; 3)": (7, 3), "far (1000007; 1000003)": (1_000_007, 1_000_003), "control (107; 3)": (107, 3)}


def naive_rotate(x: torch.Tensor, position: int, theta: float = 10000.0) -> torch.Tensor:
    """The textbook implementation: positions, frequencies and angles all in x's dtype. x: [D]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=x.dtype) / d)
    angle = torch.tensor(position, dtype=x.dtype) * inv
    re, im = x[0::2], x[1::2]
    return torch.stack((re * angle.cos() - im * angle.sin(), im * angle.cos() + re * angle.sin()), -1).flatten()


def axial_rotate(x: torch.Tensor, position: int, theta: float = 10000.0, angles: str = "float64") -> torch.Tensor:
    """axial_rope's rotation of one vector x: [D] at one position (``angles="turns"``: the path without float64)."""
    rope = ar.AxialRoPE(x.shape[-1], theta=theta, angles=angles)
    return rope.rotate(x[None, None, None], torch.tensor([float(position)]))[0, 0, 0]


def turns_rotate(x: torch.Tensor, position: int, theta: float = 10000.0) -> torch.Tensor:
    return axial_rotate(x, position, theta, angles="turns")


def score(rotate, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    """q rotated to m dotted with k rotated to n, accumulated in float64."""
    return float((rotate(q, m).double() * rotate(k, n).double()).sum())


def invariance_table(seed: int = 0, dim: int = 64) -> dict[str, dict[str, dict[str, float]]]:
    """``table[impl][dtype][pair] = score``, impl in ("naive", "axial_rope", "axial_rope (turns)")."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, dim, generator=gen, dtype=torch.float64)
    table = {}
    for impl, rotate in (("naive", naive_rotate), ("axial_rope", axial_rotate), ("axial_rope (turns)", turns_rotate)):
        dtypes = {k: v for k, v in DTYPES.items() if impl != "axial_rope (turns)" or k != "float64"}  # no float64 there
        table[impl] = {
            name: {pair: score(rotate, q.to(dtype), k.to(dtype), m, n) for pair, (m, n) in PAIRS.items()}
            for name, dtype in dtypes.items()
        }
    return table


def format_table(table: dict) -> str:
    near, far, control = PAIRS
    lines = [
        f"| implementation | dtype | score {near} | score {far} | score {control} | far - near | control - near |",
        "|---|---|---|---|---|---|---|",
    ]
    for impl, by_dtype in table.items():
        for dtype, s in by_dtype.items():
            lines.append(
                f"| {impl} | {dtype} | {s[near]:.5f} | {s[far]:.5f} | {s[control]:.5f} | {s[far] - s[near]:+.2e} | "
                f"{s[control] - s[near]:+.2e} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(format_table(invariance_table(args.seed)))


if __name__ == "__main__":
    main()
