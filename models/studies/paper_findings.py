"""What each experiment page measured that bears on each paper (:mod:`.papers`), read from the page's own intervals.

One function per page, each taking what that page's generator already holds (and its json holds): the
vision pages their :class:`~models.studies.vision.report.Table` of cells, the length page its stated
comparisons and pass rates, the streaming page its differences. The intervals are the pages' own seed-level
intervals (``crossed_t`` on the same cells for the vision pages, computed here without adding to a page's
family of tests). :func:`from_published` reads every published json for the guide's table.
"""

from __future__ import annotations

import json
from pathlib import Path

from .bootstrap import Interval
from .papers import Finding, Measurement
from .seed_intervals import crossed_t

__all__ = [
    "PAGES", "UNPUBLISHED", "from_published", "frames", "grid", "length", "packing", "resolution", "streaming", "streaming_video",
]  # fmt: skip

TINY = "tiny models trained for minutes: "


def _diff(table, group: str, a: str, b: str, metric: str) -> Interval | None:
    """``a - b`` on the page's cells (its common cells), the seed-level interval; ``None`` without two seeds."""
    x, y = table.values.get((group, a, metric)), table.values.get((group, b, metric))
    if x is None or y is None or x.shape[0] < 2:
        return None
    return crossed_t(x, y).interval


def resolution(table) -> list[Finding]:
    def m(what, group, a, b, metric, expects, digits=4):
        return Measurement(what, _diff(table, group, a, b, metric), expects, digits)

    tiled = "on 8 tokens per axis YaRN is interpolation but for one kept plane and its temperature, and the kept"
    tiled += " high-frequency plane repeats the object (tiles); the ramp the paper relies on has no planes here"
    return [
        Finding("PI", (
            m("interpolation - plain positions, class accuracy at 2x", "64x64", "interpolate", "none", "correct",
              "higher", 2),
            m("fine-tuned under interpolation - under plain positions, grown-scene loss at 2x", "64x64",
              "fine-tuned, interpolate", "fine-tuned, none", "loss_grown", "lower"),
        ), {"*": "objects grow with the image here: interpolation keeps the trained spacing between an object's"
                 " patches, plain positions ask for spacings never seen"}),
        Finding("NTK-aware", (
            m("NTK - plain positions, class accuracy at 2x", "64x64", "ntk", "none", "correct", "higher", 2),
            m("NTK - plain positions, grown-scene loss at 3x", "96x96", "ntk", "none", "loss_grown", "lower"),
        ), {"*": "with 8 planes per axis at theta 10000 NTK rescales only planes that turn less than once over the"
                 " grid: up to 2x it rotates as plain positions do, at 3x it differs a little"}),
        Finding("YaRN", (
            m("YaRN - interpolation, class accuracy at 2x", "64x64", "yarn", "interpolate", "correct", "higher", 2),
            m("YaRN - interpolation, grown-scene loss at 2x", "64x64", "yarn", "interpolate", "loss_grown", "lower"),
        ), {"*": tiled + " (the grid study tests it)"}),
        Finding("DyPE", (
            m("Dy-YaRN - YaRN, class accuracy at 2x", "64x64", "dype", "yarn", "correct", "higher", 2),
            m("Dy-YaRN - YaRN, grown-scene loss at 2x", "64x64", "dype", "yarn", "loss_grown", "lower"),
        ), {"*": "Dy-YaRN moves YaRN's ramp with the sampling time; on 8 tokens there is hardly a ramp to move:"
                 " it is YaRN at the first steps and relaxes toward plain positions at the last, a small loss edge"
                 " and no sample difference here (the grid study has a ramp)"}),
        Finding("FiT", (
            m("interpolation - plain positions, class accuracy at 1:2", "32x64", "interpolate", "none", "correct",
              "lower", 2),
            m("NTK - plain positions, grown-scene loss at 1:2", "32x64", "ntk", "none", "loss_grown", "lower"),
            m("YaRN - plain positions, grown-scene loss at 1:2", "32x64", "yarn", "none", "loss_grown", "lower"),
        ), {"*": "interpolating the long side stretches the objects as FiT reports for PI; NTK and YaRN do not beat"
                 " plain positions on an 8-token axis, where NTK is nearly plain and YaRN nearly interpolation"}),
    ]  # fmt: skip


def frames(table) -> list[Finding]:
    def m(what, group, a, b, metric, expects, digits=3):
        return Measurement(what, _diff(table, group, a, b, metric), expects, digits)

    return [
        Finding("RIFLEx", (
            m("RIFLEx - plain positions, repetition at 16 frames", "16", "RIFLEx", "none", "repetition", "lower"),
            m("RIFLEx - NTK, repetition at 16 frames", "16", "RIFLEx", "NTK", "repetition", "lower"),
            m("interpolation - plain positions, speed at 24 frames", "24", "interpolate", "none", "speed", "lower", 2),
        ), {"*": "the intrinsic plane (12.6-frame period) is the one that repeats past 8 frames; reining it in"
                 " removes the repeat as the paper says, and interpolation compresses time, so motion slows"}),
        Finding("PI", (
            m("interpolation - plain positions, repetition at 16 frames", "16", "interpolate", "none", "repetition",
              "lower"),
        ), {"*": "interpolated time positions stay inside the trained range, so no plane turns past what was seen"}),
        Finding("NTK-aware", (
            m("NTK - plain positions, repetition at 16 frames", "16", "NTK", "none", "repetition", "lower"),
        ), {"*": "NTK barely changes the high-frequency intrinsic plane that repeats, as RIFLEx's analysis says"}),
    ]  # fmt: skip


def packing(table) -> list[Finding]:
    def m(what, group, a, b, metric, expects, digits=4):
        return Measurement(what, _diff(table, group, a, b, metric), expects, digits)

    return [
        Finding("FiT", (
            m("packed - one size with interpolation, canvas loss at 2x", "64x64", "packed", "one size, interpolate",
              "loss_canvas", "lower"),
            m("packed - one size with plain positions, grown-scene loss at 1:3", "16x48", "packed", "one size, none",
              "loss_grown", "lower"),
        ), {"*": "the packed model has seen many sizes and aspects, so fewer of its test positions are new; it was"
                 " below the class criterion at its trained size (the page), so this is about loss, not samples"}),
    ]  # fmt: skip


def length(differences: dict[str, Interval | None], retrieval: dict[str, dict[str, Interval]]) -> list[Finding]:
    """``differences``: ``{"A vs B at L": interval}`` (the page's stated comparisons); ``retrieval``:
    ``{arm: {"L": pass rate}}``."""

    def m(key, expects):
        a_b, length_ = key.rsplit(" at ", 1)
        return Measurement(f"{a_b.replace(' vs ', ' - ')}, loss at {length_} bytes", differences.get(key), expects)

    def fmt(key):
        d = differences.get(key)
        return "-" if d is None else d.format(3)

    def rate(arm, L="1024"):
        r = retrieval.get(arm, {}).get(L)
        return "-" if r is None else r.format(2)

    return [
        Finding("PI", (m("PI vs RoPE at 1024", "lower"), m("PI fine-tuned x4 vs RoPE fine-tuned x4 at 1024", "lower")),
                {"*": TINY + "plausibly, a byte model leans on the exact offsets of nearby bytes, which PI compresses"
                       " 4x; and its 100 fine-tuning steps are a tenth of the paper's 1000"}),
        Finding("NTK-aware", (m("NTK vs RoPE at 1024", "lower"),),
                {"*": "NTK keeps the fast planes that carry local structure and stretches the slow ones"}),
        Finding("YaRN", (m("YaRN vs NTK at 1024", "lower"), m("YaRN vs YaRN, no attention factor at 1024", "lower"),
                         m("YaRN fine-tuned x4 vs RoPE fine-tuned x4 at 1024", "lower")),
                {"*": "the temperature helps as the paper reports; against NTK five seeds cannot separate them"}),
        Finding("Llama 3", (m("Llama 3 vs RoPE at 1024", "lower"),),
                {"*": "training-free here (the paper continues training): keeping the fast planes already helps"}),
        Finding("Dual Chunk Attention", (m("Dual Chunk vs RoPE at 1024", "lower"),),
                {"*": "every relative position it uses lies inside the trained 256 bytes"}),
        Finding("ALiBi", (m("ALiBi vs RoPE at 1024", "lower"),),
                {"*": "the bias mutes distant bytes, so past the context it behaves as a window (flat loss)"},
                note=f"inside the context RoPE is lower: ALiBi - RoPE at 256 bytes {fmt('ALiBi vs RoPE at 256')}"),
        Finding("NoPE", (m("NoPE vs RoPE at 1024", "lower"),),
                {"*": "without positions a byte model must infer order from causal masking alone; its loss is far"
                       " higher at every length, though its retrieval holds"},
                note=f"retrieval at 1024 bytes: NoPE {rate('NoPE')}, RoPE {rate('RoPE')} (no paired difference)"
                if retrieval.get("NoPE") and retrieval.get("RoPE") else ""),
    ]  # fmt: skip


def streaming(differences: dict[str, dict]) -> list[Finding]:
    """``differences``: the streaming page's ``{"A - B": {"difference": [mean, low, high], ...}}``."""

    def m(key, expects, digits):
        d = differences.get(key)
        return Measurement(f"{key}, loss at 1024 bytes", None if d is None else Interval(*d["difference"]), expects,
                           digits)  # fmt: skip

    return [
        Finding("StreamingLLM", (m("rolling, sinks 0 - full attention", "higher", 3),
                                 m("rolling, sinks 4 - rolling, sinks 0", "lower", 5)),
                {"*": TINY + "evicting the first bytes costs nothing here (4 sinks change the loss by 2e-05), so"
                       " no sink formed that a window could lose, and a window of the trained length never leaves the"
                       " trained distances (the attention mass on the first bytes is not measured yet:"
                       " design.md, Q5)"}),
    ]  # fmt: skip


def streaming_video(table) -> list[Finding]:
    def m(what, group, a, b, metric, expects, digits=2):
        return Measurement(what, _diff(table, group, a, b, metric), expects, digits)

    return [
        Finding("Diffusion Forcing", (
            m("causal streamed - bidirectional, presence at 16 frames", "16", "causal (streaming)", "bidirectional",
              "presence", "higher"),
            m("causal streamed - bidirectional, presence at 32 frames", "32", "causal (streaming)", "bidirectional",
              "presence", "higher"),
        ), {"*": TINY + "the streamed model's errors feed its next frames, and 3000 steps at 8 frames teach it"
                        " little about recovering from them"}),
        Finding("RIFLEx", (
            m("bidirectional with RIFLEx - without, repetition at 16 frames", "16", "bidirectional + RIFLEx",
              "bidirectional", "repetition", "lower", 3),
        ), {"*": "the frames study's model and its intrinsic plane, sampled again"}),
    ]  # fmt: skip


def grid(table, study) -> list[Finding]:
    """The grid study's declared contrasts on the shape error (lower is better), at its 2x and largest square and
    its first non-square size; not tested until two seeds of a cell are done."""
    square = [s for s in study.sizes if s[0] == s[1] and s[0] > study.resolution]
    two, big = f"{study.finetune_size}x{study.finetune_size}", f"{max(square)[0]}x{max(square)[1]}"
    aspect = next((f"{h}x{w}" for h, w in study.sizes if h != w), two)

    def m(what, group, a, b, expects="lower"):
        return Measurement(f"{what} at {group}", _diff(table, group, a, b, "shape_error"), expects)

    cheap = "on 16 tokens with 16 planes per axis (theta 100) the scalings differ (the page's grid table); "
    return [
        Finding("PI", (m("interpolation - plain positions, shape error", two, "interpolate", "none"),),
                {"*": cheap + "interpolation keeps an object's patches at trained spacings"}),
        Finding("NTK-aware", (m("NTK - interpolation, shape error", two, "ntk", "interpolate"),
                              m("NTK - interpolation, shape error", big, "ntk", "interpolate")),
                {"*": cheap + "NTK rescales the planes near the training extent by 0.9-0.3"}),
        Finding("YaRN", (m("YaRN - interpolation, shape error", two, "yarn", "interpolate"),
                         m("YaRN - interpolation, shape error", big, "yarn", "interpolate")),
                {"*": cheap + "YaRN keeps 1 plane, ramps 3 and interpolates 12"}),
        Finding("DyPE", (m("Dy-YaRN - YaRN, shape error", two, "dy-yarn", "yarn"),
                         m("Dy-YaRN - YaRN, shape error", big, "dy-yarn", "yarn")),
                {"*": cheap + "Dy-YaRN interpolates 15 planes at the first step and 5 at t = 0.25"}),
        Finding("FiT", (m("NTK - interpolation, shape error", aspect, "ntk", "interpolate"),
                        m("YaRN - interpolation, shape error", aspect, "yarn", "interpolate"),
                        m("interpolation - plain positions, shape error", aspect, "interpolate", "none", "higher")),
                {"*": cheap + "at 1:2 only the long side is scaled, as FiT's VisionNTK and VisionYaRN do"}),
    ]  # fmt: skip


def _vision(fn, draws_key: str = "settings"):
    def read(data: dict) -> list[Finding]:
        from .vision.report import table_from_cells

        return fn(table_from_cells(data["cells"], data["environment"][draws_key].get("draws", 2000)))

    return read


def _length(data: dict) -> list[Finding]:
    differences = {k: Interval(*v["difference"]) for k, v in data["comparisons"].items()}
    retrieval = {arm: {L: Interval(*r) for L, r in rows.items()} for arm, rows in data["retrieval"].items()}
    return length(differences, retrieval)


PAGES = {
    "resolution": _vision(resolution),
    "frames": _vision(frames),
    "packing": _vision(packing),
    "streaming-video": _vision(streaming_video),
    "length": _length,
    "streaming": lambda data: streaming(data["differences"]),
    "grid": lambda data: _grid(data),
}


def _grid(data: dict) -> list[Finding]:
    from .vision.grid import GridStudy
    from .vision.report import settings_to, table_from_cells

    study = settings_to(GridStudy, data["environment"]["settings"])
    return grid(table_from_cells(data["cells"], study.draws), study)


# pages declared before their runs, with no json published yet: the grid study (docs/experiments/design.md)
UNPUBLISHED = frozenset({"grid"})


def from_published(root: Path = Path("docs/experiments")) -> dict[str, list[Finding]]:
    """``{page: findings}`` from every published json under ``root`` (a page without its json is left out)."""
    out = {}
    for page, read in PAGES.items():
        path = root / f"{page}.json"
        if path.is_file():
            out[page] = read(json.loads(path.read_text()))
    return out


GUIDE = Path("docs/scaling.md")
BEGIN = "<!-- paper table: generated from the pages' json by models.studies.paper_findings.update_guide -->"
END = "<!-- end of the paper table -->"


def guide_block(findings_by_page: dict[str, list[Finding]]) -> str:
    """The guide's generated table, between its markers."""
    from .papers import guide_lines

    return "\n".join([BEGIN, *guide_lines(findings_by_page), END])


def update_guide(path: Path = GUIDE, root: Path = Path("docs/experiments")) -> bool:
    """Rewrite the paper table of the guide at ``path`` from the published json under ``root``; whether it changed."""
    text = path.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + guide_block(from_published(root)) + text[stop:]
    path.write_text(new)
    return new != text
