"""The length study (models/training/length_study): its statistics on data with a known answer, its probe,
its evaluation shortcuts, and the whole quick variant end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from models.gpt import GPT, STUDY_PRESETS, DualChunk
from models.training import length_study, needles
from models.training.length_study import design, evaluate, retrieval
from models.training.length_study.stats import Resampler, overlap
from models.training.length_study.summary import verdict
from models.training.tasks import TextTask, stdlib_text

# -- statistics -------------------------------------------------------------------------------


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered, trials = 0, 200
    for _ in range(trials):  # seeds shift every window alike; windows add their own noise
        values = 2.0 + rng.normal(0, 0.05, (3, 1))[:] + rng.normal(0, 0.3, (3, 100))
        covered += Resampler(3, 100, draws=400, seed=1).interval(values).low <= 2.0
    # the 2.5% lower tail: the interval's low end lies below the true mean in about 97.5% of samples
    assert 0.9 <= covered / trials <= 1.0


def test_paired_difference_resolves_what_the_separate_intervals_cannot():
    rng = np.random.default_rng(1)
    windows = rng.normal(0, 1.0, (3, 200))  # a large per-window effect that both arms share
    a, b = 3.0 + windows, 3.05 + windows + rng.normal(0, 0.01, (3, 200))
    draws = Resampler(3, 200, draws=1000, seed=0)
    ia, ib, diff = draws.interval(a), draws.interval(b), draws.difference(a, b)
    assert overlap(ia, ib)  # side by side, the arms look the same ...
    assert diff.high < 0 and diff.low == pytest.approx(-0.05, abs=0.01)  # ... paired, b is higher by 0.05
    assert verdict(diff, ia, ib).startswith("lower")
    same = draws.difference(a, a)
    assert same == (0.0, 0.0, 0.0) and verdict(same, ia, ia).startswith("not resolved")


def test_identical_draws_for_every_arm_and_shape_checked():
    one, two = Resampler(2, 5, draws=50, seed=3), Resampler(2, 5, draws=50, seed=3)
    assert np.array_equal(one.means(np.arange(10.0).reshape(2, 5)), two.means(np.arange(10.0).reshape(2, 5)))
    with pytest.raises(ValueError, match="seeds, windows"):
        one.interval(np.zeros((3, 5)))
    ratio = one.ratio(np.full((2, 5), 3.0), np.full((2, 5), 2.0))
    assert ratio == (1.5, 1.5, 1.5)


# -- the needle --------------------------------------------------------------------------------


def test_probe_plants_the_key_once_and_asks_for_it_at_the_end():
    text = stdlib_text("val").data
    inputs, keys = retrieval.probe_inputs(text, 256, 0.5, trials=4, seed=0)
    assert inputs.shape == (4, 256) and keys.shape == (4, needles.KEY_LENGTH)
    for row, key in zip(inputs.tolist(), keys.tolist()):
        seq = bytes(row) + bytes(key[-1:])  # the inputs end one byte before the sequence does
        needle = needles.NEEDLE % bytes(key)
        assert seq.endswith(needles.QUESTION + bytes(key)) and seq.count(needle) == 1
        assert 0.4 < seq.index(needle) / 256 < 0.8  # near the requested depth (the next line start)
        assert all(0x10 <= b < 0x20 for b in key)
    again, _ = retrieval.probe_inputs(text, 256, 0.5, trials=4, seed=0)
    assert torch.equal(inputs, again)  # the same probes for every arm and seed


def test_source_text_never_holds_the_needles_bytes():
    counts = torch.bincount(stdlib_text("val").data.long(), minlength=256)
    assert counts[1:32].sum() == counts[ord("\n")]  # of the control bytes only newlines


def test_study_presets_plant_keys_in_a_quarter_of_their_windows():
    task, plain = TextTask("lm-rope", 256, 0), TextTask("tiny", 256, 0)
    x, y = task.batch(0, 64)
    planted = [bytes(row).find(b"\x01") >= 0 for row in x.tolist()]
    assert 6 <= sum(planted) <= 26 and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(task.batch(0, 64)[0], x)  # a pure function of (seed, step)
    assert not any(bytes(row).find(b"\x01") >= 0 for row in plain.batch(0, 64)[0].tolist())
    model = GPT(STUDY_PRESETS["lm-rope"]).eval()
    assert retrieval.passes(model, x[:2], y[:2, -needles.KEY_LENGTH :]).shape == (2,)


# -- evaluation --------------------------------------------------------------------------------


CASES = {
    "rope": ("lm-rope", {}),
    "dual-chunk": ("lm-rope", {"dual_chunk": DualChunk(16, 4)}),
    "window": ("lm-rope", {"window": 8}),
    "alibi": ("lm-alibi", {}),
    "t5": ("lm-t5", {}),
    "linear": ("lm-linear", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_prefix_losses_are_the_losses_of_shorter_windows(case):
    preset, change = CASES[case]
    torch.manual_seed(0)
    model = evaluate.variant(GPT(replace(STUDY_PRESETS[preset], depth=1)).eval(), change)
    x = torch.randint(0, 256, (2, 48))
    y = x.roll(-1, 1)
    full = evaluate.position_losses(model, x, y)
    short = evaluate.position_losses(model, x[:, :20], y[:, :20])
    torch.testing.assert_close(full[:, :20], short, atol=1e-5, rtol=1e-5)  # causal: the prefix trick holds


def test_arms_cover_every_scheme_and_method():
    study = design.FULL
    arms = design.arms(study)
    models = {arm.model for arm in arms.values()}
    assert models == {*design.SCHEMES, "ft-pi", "ft-ntk", "ft-yarn", "long"}
    assert {"PI", "NTK", "YaRN", "YaRN, no attention factor", "Llama 3", "Dynamic NTK", "Dual Chunk"} <= set(arms)
    assert arms["YaRN"].per_length and arms["YaRN x8"].factor == 8 and not arms["YaRN x8"].per_length
    assert arms["YaRN"].change(1.0) == {"scaling": None}  # at the training length: plain RoPE
    plain = arms["YaRN, no attention factor x8"].change(2.0)["scaling"]  # a sweep ignores the length's factor
    assert (
        plain.factor == 8
        and plain.attention_scale() == 1.0
        and arms["YaRN x8"].change(2.0)["scaling"].attention_scale() > 1
    )
    assert arms["Learned"].max_length == 256
    configs = design.train_configs(study, __import__("pathlib").Path("r"))
    assert len(configs) == len(study.seeds) * (len(design.SCHEMES) + 4)
    ft, start = configs["ft-yarn", 1]
    assert (ft.context, ft.batch_size * ft.context, start) == (1024, 16 * 256, ("rope", 1))
    long, _ = configs["long", 0]
    assert long.context == 2048 and long.batch_size * long.context == 16 * 256 and long.steps == study.steps


@pytest.mark.slow
def test_quick_study_runs_end_to_end(tmp_path):
    page = length_study.run(tmp_path / "out", quick=True, root=tmp_path / "runs")
    text = page.read_text()
    assert "python -m scripts.experiments length --quick" in text
    for heading in ("paradigm comparison", "scaling benchmark", "per length", "sweeps", "Retrieval"):
        assert heading in text
    data = json.loads((tmp_path / "out" / "length.json").read_text())
    assert all(isinstance(v, dict) for v in data.values())
    assert data["paradigm"]["Learned"]["change"] is None and data["paradigm"]["RoPE"]["change"] < 1e-3
    for name in ("length.png", "length_positions.png", "length_retrieval.png"):
        assert (tmp_path / "out" / "img" / name).stat().st_size > 1000
    mtime = page.stat().st_mtime_ns
    length_study.run(tmp_path / "out", quick=True, root=tmp_path / "runs")  # everything reused: only the page
    assert page.stat().st_mtime_ns > mtime


def test_effective_context_and_break_position_follow_the_intervals():
    study = replace(design.FULL, seeds=(0, 1), windows=50, draws=300)
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, (50, 32))  # per window and 64-byte bin, shared by both arms: paired

    def raw(rise_from: int | None) -> list[dict]:
        bins = 1.5 + noise.copy()
        if rise_from is not None:
            bins[:, rise_from // 64 :] += 1.0  # breaks at `rise_from`
        loss = {L: bins[:, : L // 64].mean(1) for L in study.lengths}
        return [{"loss": loss, "bins": bins, "retrieval": {}} for _ in study.seeds]

    arms = {"flat": design.Arm("flat", "rope", "scaling"), "breaks": design.Arm("breaks", "rope", "scaling")}
    results = length_study.summary.Results(study, arms, {"flat": raw(None), "breaks": raw(640)})
    assert results.break_position("flat") is None and results.break_position("breaks") == 640
    assert results.effective_context("flat") == 2048 and results.effective_context("breaks") == 512
    assert results.ratio("breaks").low > 1 and results.difference("breaks", "flat", 256) == (0.0, 0.0, 0.0)
