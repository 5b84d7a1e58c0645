"""The registry of conventions: what each reproduces, where its upstream code lives, and how close it is.

Every convention module registers its constructors here with :func:`register`; the docs table of
``docs/conventions.md`` is :func:`table`, and the pictures of ``docs/img/conventions/`` are drawn
from :attr:`Convention.example`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ._auxiliary import DIFFUSERS_AUXILIARY

__all__ = [
    "Convention", "DiffusersFamily", "PipelineUnits", "TablesProducer", "Timing", "TrainedGrid", "DIFFUSERS", "DIFFUSERS_AUXILIARY", "DIFFUSERS_UNSUPPORTED", "FAMILIES", "QK_NORMS", "REGISTRY", "builds_rope",
    "diffusers_family", "diffusers_table", "register", "register_diffusers", "table", "trained_table",
]  # fmt: skip


def builds_rope(build: Callable) -> Callable:
    """A convention constructor computes its frequency model on the CPU, also under a meta default device, and
    hands back ropes whose buffers sit on the caller's default device (as every module's do)."""

    @functools.wraps(build)
    def constructor(*args, **kwargs):
        device = torch.get_default_device()
        with torch.device("cpu"):
            result = build(*args, **kwargs)
        for rope in _ropes(result):
            rope.to(device)
        return result

    return constructor


def _ropes(result):
    """The rope modules in a constructor's result: a rope, a list of them, or per-layer records holding one."""
    if isinstance(result, nn.Module):
        yield result
    elif isinstance(result, (list, tuple)):
        for item in result:
            yield from _ropes(item)
    elif isinstance(getattr(result, "rope", None), nn.Module):
        yield result.rope


@dataclass(frozen=True)
class Convention:
    """One production RoPE convention.

    Attributes:
        name: the constructor's name in :mod:`axial_rope.conventions`.
        family: the picture it is drawn in (``docs/img/conventions/<family>.png``).
        source: the upstream file, symbol and version the tests compare against.
        axes: axes and sections, in words.
        pairing: ``"interleaved"`` or ``"half"`` (``"per layer"`` for layer conventions).
        positions: the positions and their transform, in words.
        max_diff: the largest cos/sin difference from the upstream tables measured by the tests at
            their sizes on one machine (0 = bit for bit), for the docs table; the tests hold the
            difference to its float32 error bound, never to this measurement.
        example: a small instance, for the pictures and the docs.
        reference: ``"upstream"`` when the tests run the installed upstream code, else the citation
            of the published formula they transcribe.
    """

    name: str
    family: str
    source: str
    axes: str
    pairing: str
    positions: str
    max_diff: float
    example: Callable[[], object]
    reference: str = "upstream"


REGISTRY: dict[str, Convention] = {}

# the order of the docs table and pictures: diffusion video/image models, ViTs, multimodal, language models
FAMILIES = ("flux", "hunyuan", "wan", "cogvideox", "ltx", "lumina", "mochi", "timm", "dinov3", "qwen_vl", "videorope",
            "llm", "layers")  # fmt: skip


def register(convention: Convention) -> Convention:
    if convention.name in REGISTRY:
        raise ValueError(f"convention {convention.name!r} is registered twice")
    REGISTRY[convention.name] = convention
    return convention


def _diff(value: float) -> str:
    return "0 (bit for bit)" if value == 0 else f"{value:.0e}"


def table() -> str:
    """The markdown table of every convention (the one in ``docs/conventions.md``)."""
    rows = [
        "| convention | upstream (checked against) | axes and sections | pairing | positions | max diff |",
        "|---|---|---|---|---|---|",
    ]
    order = {family: i for i, family in enumerate(FAMILIES)}
    for c in sorted(REGISTRY.values(), key=lambda c: order.get(c.family, len(order))):  # stable within a family
        source = c.source if c.reference == "upstream" else f"{c.source} (transcribed: {c.reference})"
        rows.append(f"| `{c.name}` | {source} | {c.axes} | {c.pairing} | {c.positions} | {_diff(c.max_diff)} |")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class TablesProducer:
    """A further tables module of a model that computes several (LTX-2: video, audio and the two cross-attention
    ropes): replaced as the record's own ``("module", attr)`` is, sized by the record's grid, with its own rope,
    positions and layout (the fields of :class:`DiffusersFamily` of those names)."""

    tables: tuple[str, str]
    rope: Callable
    positions: Callable
    layout: Callable = lambda cos, sin: (cos, sin)


@dataclass(frozen=True)
class Timing:
    """How a family's forward tells the sampling time, which a time-dependent scaling follows: ``t = max((timestep -
    clean) / (noise - clean))`` from the forward argument ``argument`` (1 at pure noise, 0 clean).

    Attributes:
        argument: the forward argument carrying the step's timestep.
        noise: its value at pure noise (1000 for 1000-step schedulers' timesteps, 1 where pipelines pass sigma).
        clean: its value at a clean sample (0 unless the model's time runs from noise at 0 to clean at 1).
    """

    argument: str = "timestep"
    noise: float = 1000.0
    clean: float = 0.0


@dataclass(frozen=True)
class TrainedGrid:
    """A released checkpoint's training size, what the automatic policy (:mod:`axial_rope.policy`) plans against.

    Attributes:
        checkpoint: the released model, e.g. ``"FLUX.1 [dev]"``.
        size: the largest training size in the pipeline's units (:class:`PipelineUnits`): ``(height, width)`` pixels
            for images, ``(frames, height, width)`` for video, ``(tokens,)`` for a one-axis latent (audio).
        source: where it was read: model card, config or paper, with its address or arXiv number.
    """

    checkpoint: str
    size: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class PipelineUnits:
    """How a pipeline's size maps to the token grid of a family's grid axes.

    Attributes:
        pixels: pixels per token along y and x (the VAE's downsampling times the patch), e.g. 16 for FLUX.1
            (VAE 8, 2 x 2 patches); ``None``: the grid has no spatial axes.
        frames: ``(c, p)`` for video: ``latent = (frames - 1) // c + 1`` latent frames (the causal VAE's ``c``-fold
            compression, the first frame alone), cut into ``ceil(latent / p)`` tokens; ``None``: no time axis
            in the grid.
    """

    pixels: int | None = 16
    frames: tuple[int, int] | None = None

    def tokens(self, size: tuple[int, ...]) -> tuple[int, ...]:
        """The token grid of a pipeline ``size`` (see :class:`TrainedGrid`), one int per grid axis."""
        size = tuple(size)
        if self.pixels is None:  # a one-axis latent: the size is already tokens
            return size
        *frames, height, width = size
        spatial = (height // self.pixels, width // self.pixels)
        if self.frames is None:
            return spatial
        c, p = self.frames
        latent = (frames[0] - 1) // c + 1
        return (-(-latent // p), *spatial)


# the QK-norms a record names (DiffusersFamily.qk_norm): kind, and span when it is not one head
QK_NORMS = (None, "rms", "rms across heads", "layer", "layer across heads")


@dataclass(frozen=True)
class DiffusersFamily:
    """How a family of diffusers transformers computes and uses its RoPE: the one place a family is described.

    The adapter (:func:`axial_rope.integrations.diffusers.set_rope_processors`),
    :func:`axial_rope.rope_from_config`, the tests and the coverage table of ``docs/integrations.md`` all read
    these records; nothing else lists families. Callables take the model's config (an object or its dict),
    so the records need no diffusers import.

    Attributes:
        name: the family (its conventions file's name).
        classes: the diffusers transformer classes it covers, by class name.
        rope: ``config -> AxialRoPE``: the rope whose tables equal the model's.
        tables: where the model's rotary tables come from: ``("module", attr)``: the submodule computing
            them in the forward (the adapter replaces it when scaling); ``("method", name)``: a method of the
            model computing them (shadowed on the instance when scaling); ``("argument", name)``: a forward
            argument the pipeline passes (a forward pre-hook replaces it); ``("block argument", name)``: a forward
            argument of each rotary block (the modules ``blocks`` names: ``layers.0``, ...), which the model
            computes in a plain function (a pre-hook per block replaces it, from the block's ``hidden_states``);
            ``("fixed", attr)``: the model's own only (no spectrum to scale: unscaled processors alone).
        positions: ``config -> (rope, sizing, *inputs, **kwargs) -> (pos, scaling per axis, *context)``, from
            the tables module's inputs (the argument case: the transformer's ``hidden_states``); ``pos`` is
            ``[S, A]``, or ``[B, S, A]`` for tables per item; ``context`` (optional) is what the layout needs
            besides the tables (a split point, lengths, the inputs for a grid-shaped output); ``None`` for
            ``"fixed"``.
        layout: ``(cos, sin, *context)``: the ``[S, D]`` (``[B, S, D]``) channel tables (the rope's pairing) and
            the positions' context -> what the tables module returns.
        grid_axes: the rope axes that ``mode`` sizes (video ``(0, 1, 2)``; Flux's image ids ``(1, 2)``; Mochi's
            time ``(0,)``; ``()``: the positions are coordinates the pipeline computes, not a token grid, and
            ``mode`` is refused).
        time_axis: the rope axis of time (frames, audio samples), or ``None`` for images.
        spectrum: whether the rope has per-axis spectra that the scaling methods act on; ``False`` (learned or
            per-head frequencies): no ``scaling``, and of ``mode`` only the position modes (``"none"``,
            ``"interpolate"``, ``"normalize"``), which move positions and work with any ``F``.
        amplitude: whether the stock tables carry an amplitude (cos/sin tables do); ``False`` (a table of
            angles): scalings with an attention factor (YaRN's) are refused, the angles cannot carry it.
        stock: the stock attention processor classes (names) that :attr:`processor` replaces.
        processor: axial_rope's processor class (``axial_rope.integrations.diffusers_processors``), or
            ``None``: the stock processors stay and rotate by the adapter's tables.
        blocks: the processor name prefixes of the rotary blocks.
        qk_norm: the norm the stock processors of the rotary blocks apply to q and k right before rotating them (read
            in each stock processor of diffusers 0.42.1, for the released configs): ``"rms"`` (RMSNorm over a head's
            ``D`` channels), ``"rms across heads"`` (over a token's ``H * D``: Wan's), ``"layer"`` (LayerNorm over
            ``D``), ``"layer across heads"``; ``None``: q and k reach the rotation unnormalised, or through
            something else after the norm (SANA's ReLU kernel). What a fused norm + rotation
            (:func:`axial_rope.ops.norm_apply_rope`) computes where :attr:`processor` is ours; the docs table shows it.
        timing: how the forward tells the sampling time (:class:`Timing`), for time-dependent scaling.
        grid: ``(argument names, config -> (*arguments) -> token grid)``, for a model that computes its tables in
            several calls (text apart from image tokens): the forward's image grid (int64 ``[len(grid_axes)]``,
            the extent of every image the forward holds), read from its arguments, so that ``mode`` sizes every
            call by the same grid (the text call sees no image); ``None``: each call's inputs show the grid.
        frequencies: ``config -> (*inputs, **kwargs) -> F``: the frequency matrix the model hands its tables module
            on each forward (Mochi's learned ``pos_frequencies``), which the rotation uses in place of the rope's, so
            that the tables follow the trained weight (and its gradient flows); ``None``: the rope's own ``F``.
        producers: the model's further tables modules (:class:`TablesProducer`), where it computes several; only
            with ``tables=("module", attr)``.
        widths: ``config -> channels per position column``, for a model whose config may give an axis no channels
            (diffusers' own tiny Bria config: ``axes_dims_rope=(0, 4, 4)``, which the stock model runs): ``rope``
            is then built over the other axes, and a column of width 0 is an unrotated axis (no plane reads it, so
            a scaling there cannot act and is refused); ``None``: every column has channels.
        refused_modes: ``(mode, why)`` pairs: the position modes the family refuses at install, each with the
            reason (a mode that cannot act on its positions, or one that would move them where the model does not
            allow).
        max_diff: the largest output difference from the stock model at the training size, unscaled, with
            float64 models and inputs (so what remains is the float32 rounding of the model's tables), on
            one machine, for the docs table (``AXIAL_ROPE_MEASURE=1`` prints it); the tests check that the
            model then runs on the record's own tables instead.
        source: the upstream file and symbol the record transcribes.
        axes: the axes and their channels from the config, in words (for the docs table).
        trained: the released checkpoints' training sizes (:class:`TrainedGrid`), each with its source: what
            ``policy="auto"`` plans against (the largest extent per axis over them); ``()``: unknown, so the
            policy needs ``train_size``.
        units: how the pipeline's size (pixels, frames) maps to the token grid of ``grid_axes``.
        references: ``pos -> bool [..., S]``, True on the rows of in-context reference images (FLUX.1 Kontext's
            ids carry the reference index in their first column), whose keys Untwisting RoPE scales
            (``set_rope_processors(untwisting=...)``); ``None``: the family's tables do not mark references, or its
            transformer does not pass our tables to the processors whole.
    """

    name: str
    classes: tuple[str, ...]
    rope: Callable
    tables: tuple[str, str]
    positions: Callable | None
    layout: Callable = lambda cos, sin: (cos, sin)
    grid_axes: tuple[int, ...] = (0, 1, 2)
    time_axis: int | None = 0
    spectrum: bool = True
    amplitude: bool = True
    stock: tuple[str, ...] = ()
    processor: str | None = None
    blocks: tuple[str, ...] = ("transformer_blocks.", "single_transformer_blocks.")
    qk_norm: str | None = None
    timing: Timing = Timing()
    grid: tuple[tuple[str, ...], Callable] | None = None
    frequencies: Callable | None = None
    producers: tuple[TablesProducer, ...] = ()
    widths: Callable | None = None
    refused_modes: tuple[tuple[str, str], ...] = ()
    max_diff: float = 0.0
    source: str = ""
    axes: str = ""
    trained: tuple[TrainedGrid, ...] = ()
    units: PipelineUnits = PipelineUnits()
    references: Callable | None = None

    def __post_init__(self):
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"{self.name}: qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}")

    @property
    def scalable(self) -> bool:
        return self.tables[0] != "fixed"


DIFFUSERS: dict[str, DiffusersFamily] = {}  # diffusers class name -> its family's record
# diffusers classes that use RoPE and are not served, with the reason a user would accept
DIFFUSERS_UNSUPPORTED: dict[str, str] = {
    "HunyuanDiT2DMultiControlNetModel": "a wrapper with no config or attention processors of its own that passes "
    "the pipeline's tables to each of its `nets`: adapt each HunyuanDiT2DControlNetModel (served) instead",
    "WanAnimate2Transformer3DModel": (
        "its tables are 512-row lookup tables from a cached model method (`_rope_freqs`, one per offset), which "
        "every attention call indexes by per-sample grid sizes read on the host and a stride (`rope_apply`), so "
        "no per-token positions reach a module the adapter could size; and its generation pass runs only on a "
        "compiled flex-attention block mask over a reference KV cache"
    ),
}
# diffusers 0.42.1 classes that use RoPE and have no record yet: the work still to do, listed so that
# tests/test_diffusers_coverage.py fails for a class that is none of served, unsupported or pending
DIFFUSERS_PENDING: frozenset[str] = frozenset()  # none left in diffusers 0.42.1


def register_diffusers(family: DiffusersFamily) -> DiffusersFamily:
    for name in family.classes:
        if name in DIFFUSERS:
            raise ValueError(f"diffusers class {name!r} is in two families ({DIFFUSERS[name].name}, {family.name})")
        DIFFUSERS[name] = family
    return family


def diffusers_family(model) -> DiffusersFamily:
    """The record of a diffusers transformer (an instance; its class or a base class by name), else ``TypeError``."""
    for cls in type(model).__mro__:
        if cls.__name__ in DIFFUSERS:
            return DIFFUSERS[cls.__name__]
    raise TypeError(
        f"axial_rope has no RoPE record for {type(model).__name__}; supported: {', '.join(sorted(DIFFUSERS))}"
        + (
            f". {type(model).__name__}: {why}"
            if (why := DIFFUSERS_UNSUPPORTED.get(type(model).__name__, DIFFUSERS_AUXILIARY.get(type(model).__name__)))
            else ""
        )  # fmt: skip
    )


def _scaling_words(f: DiffusersFamily) -> str:
    if not f.scalable:
        return "none"
    refused = {mode for mode, _ in f.refused_modes}
    if f.grid_axes and f.grid_axes != tuple(range(len(f.grid_axes))):  # the adapter keeps the id axis (text) still
        refused.add("normalize")
    if not f.spectrum:
        return f"position modes ({', '.join(m for m in ('none', 'interpolate', 'normalize') if m not in refused)})"
    methods = "every method" if f.amplitude else "every method without an attention factor"
    if not f.grid_axes:
        return f"{methods}, DyPE; no mode (pipeline coordinates)"
    return f"{methods} and mode{' (not ' + ', '.join(sorted(refused)) + ')' if refused else ''}, DyPE"


def diffusers_table() -> str:
    """The markdown table of every diffusers class served (``docs/integrations.md``), from the records, and a line
    counting them and naming the RoPE classes not served."""
    rows = [
        "| model class | family | tables | axes (from the config) | time axis | scaling | QK-norm | fused processor | "
        "max diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(DIFFUSERS):
        f = DIFFUSERS[name]
        where = {"module": f"`{f.tables[1]}` returns ours", "method": f"`{f.tables[1]}()` replaced",
                 "argument": f"`{f.tables[1]}` argument replaced",
                 "block argument": f"blocks' `{f.tables[1]}` argument replaced",
                 "fixed": "the model's own (unscaled only)"}[f.tables[0]]  # fmt: skip
        time = (
            "-" if f.time_axis is None
            else ("t", "y", "x")[f.time_axis] if f.time_axis == 0 or len(f.grid_axes) == 3 else str(f.time_axis)
        )  # fmt: skip
        scaling = _scaling_words(f)
        rows.append(
            f"| `{name}` | {f.name} | {where} | {f.axes} | {time} | {scaling} | {f.qk_norm or '-'} | "
            f"{f.processor or '-'} | {_diff(f.max_diff)} |"
        )
    families = len({f.name for f in DIFFUSERS.values()})
    listed = lambda names: ", ".join(f"`{n}`" for n in sorted(names)) or "none"  # noqa: E731
    count = (f"{len(DIFFUSERS)} classes of {families} families are served. Not served, each with its reason "
             f"(`DIFFUSERS_UNSUPPORTED`): {listed(DIFFUSERS_UNSUPPORTED)}; pending (`DIFFUSERS_PENDING`): "
             f"{listed(DIFFUSERS_PENDING)}.")  # fmt: skip
    return "\n".join(rows) + "\n\n" + count + "\n"


def trained_table() -> str:
    """The markdown table of the released checkpoints' training sizes the records carry (what ``policy="auto"`` plans
    against): per family and checkpoint, the size in the pipeline's units, the token grid it gives on the family's
    grid axes (:meth:`PipelineUnits.tokens`) and where the size was read; a family without one says so (the policy
    then asks for ``train_size``)."""
    rows = [
        "| family | checkpoint | size (frames x height x width; tokens for audio) | tokens (grid axes) | source |",
        "|---|---|---|---|---|",
    ]
    for f in sorted({f.name: f for f in DIFFUSERS.values()}.values(), key=lambda f: f.name):
        if not f.trained:
            rows.append(f"| {f.name} | - | unknown: pass `train_size` | - | - |")
        for i, g in enumerate(f.trained):
            size, tokens = (" x ".join(map(str, s)) for s in (g.size, f.units.tokens(g.size)))
            source = "(as above)" if i and g.source == f.trained[i - 1].source else g.source
            rows.append(f"| {f.name} | {g.checkpoint} | {size} | {tokens} | {source} |")
    return "\n".join(rows) + "\n"
