"""Peer RoPE and RMSNorm kernels, loaded at benchmark time from package files carried with the run.

No peer code lives in this repository. ``.peers/`` (git-ignored) holds the archives,
fetched with pip on a machine with internet access::

    pip download liger-kernel --no-deps -d .peers
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip download flash-attn --no-deps --no-binary :all: \\
        --no-build-isolation -d .peers

:func:`unpack` extracts what the benchmark imports into ``.peers/site`` (Liger's wheel;
only the pure-Triton rotary file of flash-attn's sdist, whose package needs a compiled CUDA
extension). :func:`load` imports a module from there privately or under stub parent packages, so the
packages' ``__init__`` (compiled extensions, dozens of other kernels) never run and no
other library is led to believe flash-attn is installed. Each peer
is then used as its authors intend: Liger's rope on ``[B, H, S, D]`` views of ``[B, S, H, D]``
storage (as Hugging Face models hand it q and k) with full-width ``[1, S, D]`` tables,
flash-attn's rotary on ``[B, S, H, D]`` with ``[S, D/2]`` tables.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import torch

PEERS = Path(os.environ.get("AXIAL_ROPE_PEERS", Path(__file__).parents[1] / ".peers"))
FLASH_ROTARY = "flash_attn/ops/triton/rotary.py"


def unpack(peers: Path = PEERS) -> Path:
    """Extract the carried archives into ``peers/site`` (idempotent); returns the site folder."""
    site = peers / "site"
    for wheel in sorted(peers.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    for sdist in sorted(peers.glob("flash_attn-*.tar.gz")):
        with tarfile.open(sdist) as archive:
            member = next((m for m in archive.getmembers() if m.name.endswith("/" + FLASH_ROTARY)), None)
            if member is not None:
                target = site / FLASH_ROTARY
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.extractfile(member).read())
    return site


def versions(peers: Path = PEERS) -> dict[str, str]:
    """Peer name -> version, from the carried archives' file names."""
    out = {}
    for path in sorted(peers.glob("*.whl")) + sorted(peers.glob("*.tar.gz")):
        match = re.match(r"([A-Za-z0-9_]+)-([0-9][^-]*?)(?:-py3.*)?(?:\.tar\.gz|\.whl)$", path.name)
        if match:
            out[match.group(1)] = match.group(2)
    return out


def load(module: str, site: Path | None = None):
    """``module`` imported from ``site``, or a reason string when it cannot be.

    A self-contained file (flash-attn's rotary, Liger's rope: torch and triton only) is
    loaded privately by path, as ``peers.<module>``, so no other library sees a
    ``flash_attn`` package. One that imports its own package (Liger's rms_norm) gets its
    parents as stub packages with real specs, whose ``__init__`` is not run.
    """
    site = site or PEERS / "site"
    parts = module.split(".")
    path = site.joinpath(*parts[:-1], parts[-1] + ".py")
    if not path.exists():
        return f"not carried ({path} missing; see scripts/peers.py)"
    try:
        if f"import {parts[0]}" not in path.read_text() and f"from {parts[0]}" not in path.read_text():
            spec = importlib.util.spec_from_file_location(f"peers.{module}", path)
            loaded = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded)
            return loaded
        for i in range(1, len(parts)):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
                spec.submodule_search_locations = [str(site.joinpath(*parts[:i]))]
                sys.modules[name] = importlib.util.module_from_spec(spec)
        return importlib.import_module(module)
    except Exception as err:  # a peer's own imports may need what the GPU machine lacks
        return f"not importable ({type(err).__name__}: {err})"


class FlashRotary(torch.autograd.Function):
    """flash-attn's ``apply_rotary`` on one tensor ``[B, S, H, D]``; backward: the same with ``conjugate=True``."""

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, apply_rotary):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved, ctx.apply_rotary = interleaved, apply_rotary
        return apply_rotary(x, cos, sin, interleaved=interleaved)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return ctx.apply_rotary(grad, cos, sin, interleaved=ctx.interleaved, conjugate=True), None, None, None, None


def rope_peers(cos: torch.Tensor, sin: torch.Tensor, pairing: str, device: str) -> dict:
    """name -> (layout, rotate(q, k)) for the Triton peers, or name -> reason when one cannot run here.

    ``cos``/``sin``: float32 ``[S, D]`` channel tables in the pairing's layout.
    """
    out = {}
    interleaved = pairing == "interleaved"
    planes = lambda t: (t[:, 0::2] if interleaved else t[:, : t.shape[1] // 2]).contiguous()
    flash = load("flash_attn.ops.triton.rotary")
    if isinstance(flash, str) or device != "cuda":
        out["flash-attn rotary"] = flash if isinstance(flash, str) else "needs CUDA"
    else:
        half_cos, half_sin, fn = planes(cos), planes(sin), flash.apply_rotary
        out["flash-attn rotary"] = (
            "bshd",
            lambda q, k: tuple(FlashRotary.apply(t, half_cos, half_sin, interleaved, fn) for t in (q, k)),
        )
    liger = load("liger_kernel.ops.rope")
    if interleaved:
        out["liger rope"] = "half pairs only (rotate_half)"
    elif isinstance(liger, str) or device != "cuda":
        out["liger rope"] = liger if isinstance(liger, str) else "needs CUDA"
    else:
        # HF's layout: [B, H, S, D]-shaped views of [B, S, H, D] storage (Liger transposes back, no copy)
        fn = liger.LigerRopeFunction.apply
        out["liger rope"] = ("bshd", lambda q, k: fn(q.transpose(1, 2), k.transpose(1, 2), cos[None], sin[None]))
    return out


def rms_norm_candidates(weight: torch.Tensor, eps: float, device: str) -> dict:
    """name -> rms_norm(x) over the last axis (weights ``[D]``), for the fastest-unfused baseline; or a reason."""

    def reference(x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

    out = {"torch.compile rms_norm": torch.compile(reference)}  # dynamic after the first shape: few compiles
    if hasattr(torch.nn.functional, "rms_norm"):
        out["F.rms_norm"] = lambda x: torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)
    liger = load("liger_kernel.ops.rms_norm")
    if isinstance(liger, str) or device != "cuda":
        out["liger rms_norm"] = liger if isinstance(liger, str) else "needs CUDA"
    else:
        fn = liger.LigerRMSNormFunction.apply
        out["liger rms_norm"] = lambda x: fn(x.reshape(-1, x.shape[-1]), weight.to(x.dtype), eps).view(x.shape)
    return out
