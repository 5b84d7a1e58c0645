"""The resolution, frame and packing studies (models/studies/vision): RIFLEx's k, the test sets, the
object metrics and their statistics on inputs with known answers, and the studies' quick variants end to end."""

from __future__ import annotations

import collections
import functools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_torch_thread

import axial_rope as ar
from models.studies.vision import figures, run_frames, run_packing, run_resolution
from models.studies.vision.metrics import image_metrics, reference, repetition, video_metrics
from models.studies.vision.objects import BACKGROUND, components, find_objects
from models.training.data import Canvas, MovingShapes, Shapes

_one_thread = one_torch_thread()


# -- RIFLEx's intrinsic frequency, as the paper picks it ------------------------------------------


def test_riflex_k_reproduces_the_papers_choices():
    k = ar.scaling.RIFLEx.intrinsic_k
    # HunyuanVideo: temporal rope 16 channels, theta 256, 129 frames -> 33 latent frames; periods 6.3 12.6 25 50 ...
    assert k(16, 256.0, 33) == 4
    # CogVideoX: head dim 64 split t 16 / y 24 / x 24 (diffusers' get_3d_rotary_pos_embed), theta 10000, 49 -> 13
    assert k(16, 10000.0, 13) == 2
    # from the first repetition seen in a generated video (the authors' identify_k): the nearest period
    assert k(16, 256.0, 33, repetition_frame=50) == 4 and k(16, 10000.0, 13, repetition_frame=21) == 2
    assert k(16, 256.0, 8) == 2  # the frame study's model: period 12.6, inside a 16-24-frame window
    with pytest.raises(ValueError, match="fits in the training length"):
        k(4, 2.0, 100)


# -- the test sets -------------------------------------------------------------------------------


def test_grown_scenes_are_the_training_scenes_larger():
    data = Shapes(seed=3)
    torch.testing.assert_close(data.grown(range(6), 48), data.batch(range(6), 48))
    images, labels = data.grown(range(6), (32, 64))
    assert images.shape == (6, 3, 32, 64) and torch.equal(labels, data.batch(range(6), 32)[1])


def test_canvas_keeps_trained_pixel_sizes_and_separate_objects():
    canvas = Canvas(seed=1, train_resolution=32, max_objects=3)
    images, labels, counts = canvas.batch(range(40), (64, 96))
    again = canvas.batch(range(40), (64, 96))
    assert torch.equal(images, again[0]) and counts.min() == 1 and counts.max() == 3
    found, _ = find_objects(images)
    assert [len(f) for f in found] == counts.tolist()  # none touches another
    ref = reference(32)
    sizes = [math.sqrt(o.area / ref.areas[int(y)]) for f, y in zip(found, labels) for o in f]
    assert 0.7 < min(sizes) and max(sizes) < 1.4  # the trained pixel size, not grown with the canvas


def test_held_out_canvas_fits_its_objects_below_the_training_size():
    from models.studies.vision.resolution import QUICK, held_out_sets

    study = __import__("dataclasses").replace(QUICK, resolution=32)
    for size in ((16, 48), (24, 24)):  # shorter than the 32 px the objects were trained at
        images = held_out_sets(study, size)["canvas"][0]  # [N, 3, H, W]
        border = torch.cat([images[..., 0, :], images[..., -1, :], images[..., :, 0], images[..., :, -1]], -1)
        # objects sit 2 px inside their cell, their anti-aliased edge 1 px: the border is background, nothing clipped
        assert torch.equal(border, torch.full_like(border, BACKGROUND))
        assert all(len(f) >= 1 for f in find_objects(images)[0])  # and every image still holds its objects


# -- objects and metrics on pictures whose answer is known ------------------------------------------


def test_components_match_a_breadth_first_search():
    mask = torch.rand(3, 17, 23, generator=torch.Generator().manual_seed(0)) > 0.45
    labels = components(mask)
    for b in range(3):
        seen, n = -torch.ones(17, 23, dtype=torch.long), 0
        for start in zip(*torch.nonzero(mask[b], as_tuple=True)):
            start = tuple(int(v) for v in start)
            if seen[start] >= 0:
                continue
            queue, seen[start] = collections.deque([start]), n
            while queue:
                y, x = queue.popleft()
                for yy, xx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= yy < 17 and 0 <= xx < 23 and mask[b, yy, xx] and seen[yy, xx] < 0:
                        seen[yy, xx] = n
                        queue.append((yy, xx))
            n += 1
        pairs = set(zip(labels[b][mask[b]].tolist(), seen[mask[b]].tolist()))
        assert len(pairs) == n == int(labels[b].max()) and int(labels[b][~mask[b]].abs().sum()) == 0


class Oracle(torch.nn.Module):
    """A 'classifier' that answers a fixed class: the metrics' own arithmetic, without a trained one."""

    def __init__(self, answer: int):
        super().__init__()
        self.answer = answer

    def forward(self, x):
        return torch.nn.functional.one_hot(torch.full((len(x),), self.answer), 4).float()


def test_image_metrics_read_size_count_and_colour():
    ref = reference(32)
    images, labels = Shapes(seed=5).grown(range(40), 64)  # twice the training size: objects twice as wide
    triangles = labels == 2  # as the oracle answers
    images, labels = images[triangles][:4], labels[triangles][:4]
    metrics = image_metrics(images, labels, Oracle(2), ref)
    assert metrics["correct"].tolist() == [1.0] * 4 and metrics["objects"].tolist() == [1.0] * 4
    trained = image_metrics(Shapes(seed=5).grown(range(40), 32)[0][triangles][:4], labels, Oracle(2), ref)
    assert np.all(np.abs(metrics["size"] / trained["size"] - 2) < 0.1)  # the same scenes, twice as wide (edges: 7%)
    assert np.all(np.abs(trained["size"] - 1) < 0.25) and np.all(metrics["color"] < 0.01)
    blank = torch.full((2, 3, 32, 32), BACKGROUND)
    empty = image_metrics(blank, torch.tensor([0, 1]), Oracle(0), ref)
    assert empty["correct"].tolist() == [0.0, 0.0] and np.isnan(empty["size"]).all()
    assert image_metrics(images, labels, Oracle(1), ref)["correct"].sum() == 0


def test_video_metrics_see_absent_frames_repetition_and_motion():
    ref = reference(32, moving=True)
    clip, labels = MovingShapes(seed=2, max_speed=0.03, max_spin=0.0).batch(range(2), 32, frames=6)
    clip = clip.transpose(1, 2)  # [B, 3, T, H, W]
    looped = torch.cat([clip, clip, clip], 2)  # period 6 over 18 frames
    still = clip[:, :, :1].expand(-1, -1, 18, -1, -1)
    gone = looped.clone()
    gone[:, :, ::2] = BACKGROUND  # every other frame empty
    m = {name: video_metrics(v, labels, Oracle(0), ref, lag=6) for name, v in
         (("looped", looped), ("still", still), ("gone", gone))}  # fmt: skip
    assert np.all(m["looped"]["repetition"] > 0.2) and np.all(np.abs(m["still"]["repetition"]) < 1e-9)
    assert m["gone"]["presence"].tolist() == [0.5, 0.5] and m["still"]["speed"].tolist() == [0.0, 0.0]
    real, y = MovingShapes(seed=2, max_speed=0.03, max_spin=0.0).batch(range(2), 32, frames=18)
    moving = video_metrics(real.transpose(1, 2), y, Oracle(0), ref, lag=6)
    assert np.all(moving["repetition"] < 0.05) and np.all(moving["speed"] > 0.1) and np.all(moving["jerk"] < 0.5)
    assert math.isnan(repetition(torch.zeros(4, 8, 8, dtype=torch.bool), 6))  # shorter than the lag


def test_figure_cells_are_at_least_96_pixels(tmp_path):
    from PIL import Image

    images = torch.zeros(4, 3, 32, 48, dtype=torch.uint8)
    path = figures.labelled_grid([("a", images), ("b", images)], tmp_path / "grid.png")
    assert Image.open(path).height >= 2 * figures.MIN_CELL
    videos = torch.randint(0, 255, (2, 3, 5, 16, 16), dtype=torch.uint8)  # distinct frames (a GIF merges equal ones)
    gif = Image.open(figures.labelled_gif([("a", videos)], tmp_path / "clip.gif"))
    assert gif.n_frames == 5 and gif.height >= figures.MIN_CELL
    strip = Image.open(figures.frame_strips([("a", videos[0])], tmp_path / "strip.png"))
    assert strip.width >= 5 * figures.MIN_CELL


# -- both studies end to end, quick ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["resolution", "frames", "packing"])  # about 5-10 s each
def test_quick_study_writes_tables_pictures_and_reuses_its_runs(name, tmp_path, capsys):
    packing = functools.partial(run_packing, base_root=tmp_path / "resolution")  # the one-size runs: here too
    run = {"resolution": run_resolution, "frames": run_frames, "packing": packing}[name]
    page = run(tmp_path / "out", quick=True, root=tmp_path / "runs").read_text()
    assert page.startswith("# ") and f"python -m scripts.experiments {name} --quick" in page
    assert "Checkpoints (SHA-256" in page and page.count("|---|") >= 3
    assert not re.search(r"\{[a-z_.]+\}", page)  # every placeholder filled in (a string that lost its f)
    assert re.search(r"\| -?\d+\.\d+ \[-?\d+\.\d+, -?\d+\.\d+\] \|", page)  # a mean and its interval in a table
    data = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert data["environment"]["versions"]["torch"] == torch.__version__ and data["results"]
    # the page regenerates from its json alone, byte for byte (every cell and the draws are stored)
    from models.studies.vision import frames_page, packing_page, resolution_page

    markdown = {"resolution": resolution_page, "frames": frames_page, "packing": packing_page}[name].markdown
    assert markdown(data) == page and data["cells"]
    if name != "frames":  # class accuracy split by conditioning class, from the cells and the stored labels
        from models.studies.vision.metrics import per_class_accuracy
        from models.training.data import CLASSES

        group = next(iter(data["cells"]))
        arm = next(iter(data["cells"][group]))
        labels = data["sample_labels"][group]
        correct = np.array(data["cells"][group][arm]["correct"], dtype=np.float64)  # [seeds, samples]
        assert labels == sorted(labels) and set(labels) == set(range(len(CLASSES)))
        expected = [correct[:, np.array(labels) == c].mean() for c in range(len(CLASSES))]  # independent: by mask
        assert per_class_accuracy(correct, labels).tolist() == expected
        row = f"| {arm} | " + " | ".join(f"{a:.2f}" for a in expected) + " |"
        assert "| arm | " + " | ".join(CLASSES) + " |" in page and row in page
    assert all(p.stat().st_size > 100 for p in (tmp_path / "out" / "img").iterdir())
    capsys.readouterr()
    run(tmp_path / "out", quick=True, root=tmp_path / "runs")  # everything is there: nothing recomputed
    log = capsys.readouterr().out
    assert log.count(": reused") + log.count(": ready") == log.count("] ")


def test_packing_checks_its_one_size_arms_against_the_resolution_page(tmp_path):
    # the packing page compares its one-size arms with the resolution study's json: hashes and each seed's means
    run_resolution(tmp_path / "out", quick=True, root=tmp_path / "resolution")
    page = run_packing(tmp_path / "out", quick=True, root=tmp_path / "runs", base_root=tmp_path / "resolution")
    check = re.search(r"Check against .*?: (\d+) of (\d+) one-size checkpoints .*? over the (\d+) .*? is: (.*)\.\n",
                      page.read_text())  # fmt: skip
    assert check and check.group(1) == check.group(2) == "1" and int(check.group(3)) > 0  # the same runs
    gaps = [float(gap.rsplit(" ", 1)[1]) for gap in check.group(4).split("; ")]
    assert len(gaps) == 4 and gaps == [0.0] * 4  # the same weights: the same figures
    # a resolution json of runs trained longer (the page re-run with more steps) is not compared: other weights
    from dataclasses import replace

    from models.studies.vision import packing, packing_page

    data = json.loads((tmp_path / "out" / "resolution.json").read_text())
    data["environment"]["settings"]["steps"] += 1
    (tmp_path / "longer.json").write_text(json.dumps(data))
    study = replace(packing.QUICK, base_root=str(tmp_path / "resolution"))
    hashes = json.loads((tmp_path / "out" / "packing.json").read_text())["environment"]["checkpoints"]
    text = packing_page.reproduction(study, tmp_path / "runs", tmp_path / "longer.json", hashes)
    steps = study.base.steps
    assert text.endswith(f"was made with other settings (steps {steps + 1} there, {steps} here).")
    assert text.startswith("The one-size arms were not compared with the [resolution study](resolution.md)'s json of")


def test_published_json_gaps_are_matched_cell_by_cell(tmp_path):
    # a page checks its runs against another study's json only where that json holds the (group, arm, seed)
    from models.studies.vision.report import Published

    env = {"settings": {"seeds": [0, 2], "steps": 10, "sizes": [[8, 8]]}, "checkpoints": {"s0": "a"}, "date": "d"}
    cells = {"8x8": {"none": {"loss": [[1.0, 3.0], [5.0, None]]}}}  # seed 0 mean 2, seed 2 mean 5 (None: undefined)
    (tmp_path / "p.json").write_text(json.dumps({"environment": env, "cells": cells}))
    theirs = Published.read(tmp_path / "p.json")
    ours = {("8x8", "none", 0): {"loss": 2.5}, ("8x8", "none", 2): {"loss": 4.0}, ("8x8", "none", 1): {"loss": 99.0},
            ("8x8", "yarn", 0): {"loss": 99.0}, ("9x9", "none", 0): {"loss": 99.0}}  # fmt: skip
    assert theirs.largest_gaps(ours) == ({"loss": 1.0}, 2)  # seed 1, arm yarn and group 9x9 are not theirs
    assert theirs.same_hashes({0: "a", 2: "b"}) == 1
    assert theirs.differing({"seeds": (0,), "steps": 10, "sizes": ((16, 16),)}, ignore=("seeds", "sizes")) == ""
    assert theirs.differing({"steps": 20, "lr": 0.1}, ignore=()) == "steps 10 there, 20 here; lr None there, 0.1 here"


def test_distance_to_sinks_is_zero_on_a_sink_copy_scale_free_and_sqrt2_for_an_uncorrelated_frame():
    from models.studies.streaming_video import distance_to_sinks

    g = torch.Generator().manual_seed(0)
    frames = torch.randn(2, 3, 5, 16, 16, generator=g, dtype=torch.float64)
    frames[:, :, 3] = frames[:, :, 0]  # frame 3 snapped back to the sink
    d = distance_to_sinks(frames)
    assert d.shape == (2, 5) and torch.equal(d[:, 0], torch.zeros(2)) and torch.equal(d[:, 3], torch.zeros(2))
    # uncorrelated frames of the same mean and contrast: ||a - b|| / ||a|| -> sqrt(2) (768 values: within 0.1)
    assert ((d[:, [1, 2, 4]] - 2**0.5).abs() < 0.1).all()
    torch.testing.assert_close(distance_to_sinks(3 * frames + 1), d, rtol=1e-12, atol=1e-12)  # contrast and offset
    two = distance_to_sinks(frames, sinks=2)
    assert torch.equal(two[:, 1], torch.zeros(2)) and (two <= d + 1e-12).all()  # more sinks: nearer or equal
    with pytest.raises(ValueError, match="sinks"):
        distance_to_sinks(frames, sinks=5)
    with pytest.raises(ValueError, match="videos"):
        distance_to_sinks(frames[0])


def test_quick_streaming_video_study_reuses_the_frames_runs_and_regenerates_from_its_json(tmp_path, capsys):
    from dataclasses import asdict, replace

    from models.studies import streaming_video, streaming_video_page

    base_root = tmp_path / "frames"
    run_frames(tmp_path / "out", quick=True, root=base_root)  # its json is what the bidirectional arm is checked on
    path = streaming_video_page.run(tmp_path / "out", quick=True, root=tmp_path / "runs", base_root=base_root)
    page, data = path.read_text(), json.loads((tmp_path / "out" / "streaming-video.json").read_text())
    check = re.search(r"Check against .*?: (\d+) of (\d+) bidirectional .*? over the (\d+) .*? is: presence (\S+),"
                      r" class accuracy (\S+)\.\n", page)  # fmt: skip
    assert check and check.groups() == ("1", "2", "2", "0", "0")  # seed 0 at 4 and 8 frames: the same runs and clips
    assert not re.search(r"\{[a-z_.]+\}", page) and re.search(r"\| -?\d+\.\d+ \[-?\d+\.\d+, -?\d+\.\d+\] \|", page)
    assert streaming_video_page.markdown(data) == page  # every number recomputed from the json's cells
    study = replace(streaming_video.QUICK, base_root=str(base_root))
    runs = streaming_video.all_runs(study, tmp_path / "runs")
    for seed in study.seeds:  # the bidirectional arm is the frames study's run; the causal one differs in that alone
        bi, causal = asdict(runs[f"s{seed}-bidirectional"]), asdict(runs[f"s{seed}-causal"])
        assert Path(bi["out"]).parent.parent == base_root and (Path(bi["out"]) / "checkpoint.safetensors").is_file()
        assert {k for k in bi if bi[k] != causal[k]} == {"causal", "out"}
    capsys.readouterr()
    streaming_video_page.run(tmp_path / "out", quick=True, root=tmp_path / "runs", base_root=base_root)
    log = capsys.readouterr().out
    assert log.count(": reused") + log.count(": ready") == log.count("] ")  # nothing recomputed


@pytest.mark.parametrize(
    "name, module",
    [("resolution", "vision.resolution_page"), ("frames", "vision.frames_page"), ("packing", "vision.packing_page"),
     ("streaming-video", "streaming_video_page")],
)  # fmt: skip
def test_published_pages_regenerate_from_their_json(name, module):
    # every number on a page is recomputed from the cells its json publishes (intervals: the same draws)
    import importlib

    root = Path(__file__).resolve().parents[1] / "docs" / "experiments"
    page = importlib.import_module(f"models.studies.{module}")
    data = json.loads((root / f"{name}.json").read_text())
    assert page.markdown(data) == (root / f"{name}.md").read_text()
