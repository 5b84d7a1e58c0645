"""The length study (models/studies/length): its statistics on data with a known answer, its probe,
its evaluation shortcuts, and the whole quick variant end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import U32, chain_bound

from models.gpt import GPT
from models.studies import length as length_study
from models.studies.bootstrap import Bootstrap, Interval
from models.studies.length import design, evaluate, report, retrieval
from models.studies.length.positions import STUDY_PRESETS, DualChunk
from models.studies.length.summary import verdict
from models.training import needles
from models.training.text_task import TextTask, stdlib_text

# -- statistics (the bootstrap itself: tests/test_bootstrap.py) ----------------------------------


def test_verdict_words_follow_the_paired_interval_and_say_whether_the_sides_overlap():
    a, b = Interval(3.0, 2.9, 3.1), Interval(3.05, 2.95, 3.15)
    assert verdict(Interval(-0.05, -0.06, -0.04), a, b) == "lower (paired interval excludes 0; their intervals overlap)"
    far = Interval(4.0, 3.9, 4.1)
    assert verdict(Interval(1.0, 0.9, 1.1), far, a).startswith(
        "higher (paired interval excludes 0; their intervals do not"
    )
    assert verdict(Interval(0.0, -0.01, 0.01), a, a).startswith(
        "not resolved: the paired difference's interval contains 0"
    )


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
        assert all(b in alphabet for b, alphabet in zip(key, needles.ALPHABETS))
    again, _ = retrieval.probe_inputs(text, 256, 0.5, trials=4, seed=0)
    assert torch.equal(inputs, again)  # the same probes for every arm and seed


def test_source_text_never_holds_the_needles_bytes():
    counts = torch.bincount(stdlib_text("val").data.long(), minlength=256)
    assert counts[1:32].sum() == counts[ord("\n")]  # of the control bytes only newlines


def test_study_presets_plant_a_key_in_every_window():
    task, plain = TextTask("lm-rope", 256, 0), TextTask("tiny", 256, 0)
    x, y = task.batch(0, 64)
    planted = [bytes(row).count(b"\x01") == 2 for row in x.tolist()]  # the needle's marker and the question's
    assert sum(planted) == 64 and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(task.batch(0, 64)[0], x)  # a pure function of (seed, step)
    assert not any(bytes(row).find(b"\x01") >= 0 for row in plain.batch(0, 64)[0].tolist())
    model = task.build().eval()
    assert retrieval.passes(model, x[:2], y[:2, -needles.KEY_LENGTH :]).shape == (2,)


def test_a_planted_keys_answer_weighs_key_weight_in_the_loss():
    task, plain = TextTask("lm-rope", 64, 0), TextTask("tiny", 64, 0)
    x, y = task.batch(3, 16)
    w = task.target_weights(3, 16)
    assert plain.target_weights(3, 16) is None
    answers = []
    for r in range(16):  # every window holds a key (NEEDLE_RATE = 1), asked for after the needle
        row, targets = bytes(x[r].tolist()), bytes(y[r].tolist())
        needle = row.index(needles.NEEDLE[:1])
        at = row.index(needles.QUESTION, needle + 1) + len(needles.QUESTION) - 1  # the question's last byte
        assert targets[at : at + needles.KEY_LENGTH] == row[needle + 1 : needle + 1 + needles.KEY_LENGTH]
        expected = torch.ones(64)
        expected[at : at + needles.KEY_LENGTH] = needles.KEY_WEIGHT
        assert torch.equal(w[r], expected)
        answers.append(at)
    assert min(answers) < 50 < max(answers)  # asked anywhere after the needle, not always at the window's end
    torch.manual_seed(0)
    model = task.build()
    per = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).double(), y.flatten(), reduction="none")
    # the weighted sum over the targets divided by their number. Tolerance: a float32 sum of 1024 positive terms
    # is within 1024 * 2**-24 = 6.1e-5 of the exact one (the recursive-summation bound), and float32 log-softmax
    # adds a few ulps per term; dividing by the weights' sum instead is off by about 31 / 1024 per planted window
    loss = task.loss(model, 3, 16).item()
    assert loss == pytest.approx((per * w.flatten().double()).mean().item(), rel=1e-4)
    assert loss != pytest.approx((per * w.flatten().double()).sum().item() / w.sum().item(), rel=1e-3)
    halves = [task.loss(model, 3, 16, rank=r, world=2).item() for r in range(2)]
    assert sum(halves) / 2 == pytest.approx(loss, rel=1e-4)  # two ranks' mean is the one-process loss


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
    config, positions = STUDY_PRESETS[preset]
    model = evaluate.variant(GPT(replace(config, depth=1), positions=positions).eval(), change).double()
    x = torch.randint(0, 256, (2, 48))
    y = x.roll(-1, 1)
    full = evaluate.position_losses(model, x, y)
    short = evaluate.position_losses(model, x[:, :20], y[:, :20])
    # causal: the prefix trick holds. An equality, so the model runs in float64 (its windows sum in other
    # orders: 1e-12); position_losses rounds the logits to float32 and takes a float32 cross-entropy over
    # the 256 bytes: within helpers.chain_bound(U32, 256, 2) of the losses' scale
    tol = chain_bound(U32, 256, 2) * float(short.abs().max())
    torch.testing.assert_close(full[:, :20], short, atol=tol, rtol=0)


def test_published_design_trains_three_schemes_and_states_only_verdicts_on_its_arms():
    study = design.FULL
    arms = design.arms(study)
    assert {arm.model for arm in arms.values()} == {"rope", "nope", "alibi", "ft-rope", "ft-pi", "ft-ntk", "ft-yarn"}
    assert arms["RoPE"].retrieval and "T5 bias" not in arms
    assert len(design.train_configs(study, __import__("pathlib").Path("r"))) == len(study.seeds) * (3 + 4)
    # the study's record of how keys are planted must be what the trainer does
    with pytest.raises(ValueError, match="plants a key in 1 of the training windows with its answer weighted 32"):
        design.train_configs(replace(study, needle_rate=0.25, key_weight=1.0), __import__("pathlib").Path("r"))
    with pytest.raises(ValueError, match="asked for anywhere after it; the study asks for 1, 32 and at the end"):
        design.train_configs(replace(study, asked="at the end"), __import__("pathlib").Path("r"))
    pairs = length_study.comparisons(study)
    assert pairs and all(a in arms and b in arms for a, b, _ in pairs)
    assert ("RoPE fine-tuned x4", "RoPE", 1024) in pairs and ("YaRN fine-tuned x4", "RoPE fine-tuned x4", 1024) in pairs
    assert "T5 bias" in report.left_out(study) and "NoPE" not in report.left_out(study)
    with pytest.raises(ValueError, match="schemes"):
        design.Study(schemes=("nope",))


def test_arms_cover_every_scheme_and_method():
    study = design.Study()  # every scheme, the sweeps and the upper bound
    arms = design.arms(study)
    models = {arm.model for arm in arms.values()}
    assert models == {*design.SCHEMES, "ft-rope", "ft-pi", "ft-ntk", "ft-yarn", "long"}
    assert {"PI", "NTK", "YaRN", "YaRN, no attention factor", "Llama 3", design.DYNAMIC_NTK, "Dual Chunk"} <= set(arms)
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
    assert len(configs) == len(study.seeds) * (len(design.SCHEMES) + 5)
    ft, start = configs["ft-yarn", 1]
    assert (ft.context, ft.batch_size * ft.context, start) == (1024, 16 * 256, ("rope", 1))
    control, start = configs["ft-rope", 1]  # plain positions, the same steps, tokens and data as ft-yarn
    assert (control.preset, start) == ("lm-rope", ("rope", 1))
    assert {k: v for k, v in vars(control).items() if k not in ("preset", "out")} == {
        k: v for k, v in vars(ft).items() if k not in ("preset", "out")
    }
    long, _ = configs["long", 0]
    assert long.context == 2048 and long.batch_size * long.context == 16 * 256 and long.steps == study.steps


@pytest.mark.slow
def test_a_study_without_probe_sweeps_or_bound_says_what_it_left_out(tmp_path):
    study = replace(design.QUICK, schemes=("rope", "alibi"), bound=False, sweep=(), probe=False)
    text = length_study._run(study, tmp_path / "out", tmp_path / "runs").read_text()  # run() less its thread setting
    assert "retrieval probe is not run here" in text and "Not trained here: NoPE" in text and "T5 bias: at" in text
    assert "No upper bound is trained" in text and "sweeps" not in text and "retrieval at" not in text
    assert (
        "| ALiBi |" in text
        and "| NoPE |" not in text
        and not (tmp_path / "out" / "img" / "length_retrieval.png").exists()
    )
    data = json.loads((tmp_path / "out" / "length.json").read_text())
    assert length_study.markdown(data) == text and data["retrieval"] == {}


@pytest.mark.slow
def test_quick_study_runs_end_to_end(tmp_path):
    page = length_study.run(tmp_path / "out", quick=True, root=tmp_path / "runs")
    text = page.read_text()
    assert "python -m scripts.experiments length --quick" in text
    for heading in ("paradigm comparison", "scaling benchmark", "per length", "sweeps", "Retrieval"):
        assert heading in text
    data = json.loads((tmp_path / "out" / "length.json").read_text())
    assert all(isinstance(v, dict) for v in data.values())
    rope = np.array(data["cells"]["RoPE"]["loss"][str(design.QUICK.context)])  # [seeds, windows]: recomputable
    assert rope.shape == (len(design.QUICK.seeds), design.QUICK.windows)
    redo = Bootstrap(*rope.shape, design.QUICK.draws, seed=0).interval(rope)
    assert list(redo) == pytest.approx(data["loss"]["RoPE"][str(design.QUICK.context)], rel=1e-12)
    assert data["paradigm"]["Learned"]["change"] is None and data["paradigm"]["RoPE"]["change"] < 1e-3
    for name in ("length.png", "length_positions.png", "length_retrieval.png"):
        assert (tmp_path / "out" / "img" / name).stat().st_size > 1000
    # the page regenerates from its json alone, byte for byte; the windows' source files are stored with it
    assert length_study.markdown(data) == text
    assert data["windows"]["sources"] == evaluate.window_sources(design.QUICK)
    mtime = page.stat().st_mtime_ns
    length_study.run(tmp_path / "out", quick=True, root=tmp_path / "runs")  # everything reused: only the page
    assert page.stat().st_mtime_ns > mtime


def test_effective_context_and_break_position_follow_the_intervals():
    study = replace(design.Study(), seeds=(0, 1, 2), windows=50, draws=300)  # 3 seeds: t[2] at Bonferroni 0.05 / 27
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


def test_window_sources_are_the_files_the_windows_start_in():
    import sysconfig

    val = stdlib_text("val")
    study = replace(design.Study(), windows=40)
    sources, (x, _) = evaluate.window_sources(study, val), evaluate.eval_windows(study, val)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    ends, total = [], 0  # the reference: every held-out file's byte range in the text, from the files themselves
    for name in val.names:
        total += len((stdlib / name).read_bytes()) + 1  # each file and its newline
        ends.append(total)
    starts = torch.linspace(0, len(val) - study.longest - 1, study.windows).long().tolist()  # as eval_windows
    for name, start, row in zip(sources, starts, x.tolist()):
        i = int(np.searchsorted(ends, start, side="right"))  # the first file ending after the start
        assert name == val.names[i]
        text, offset = (stdlib / name).read_bytes() + b"\n", start - (ends[i - 1] if i else 0)
        n = min(16, len(text) - offset)  # the window's bytes that lie in its source file
        assert n > 0 and bytes(row[:n]) == text[offset : offset + n]
    assert len(sources) == study.windows and len(set(sources)) > 5


def _two_arm_results(shift: float, seeds=(0, 1, 2), windows: int = 24) -> length_study.summary.Results:
    """Arms "a" and "b" of a study with a seed effect and a file effect shared by both; "a" is ``shift`` higher."""
    study = replace(design.Study(), seeds=seeds, windows=windows, draws=400, lengths=(256, 512))
    rng = np.random.default_rng(1)
    files = [f"f{i % 4}.py" for i in range(windows)]  # 4 source files
    file_effect = rng.normal(0, 0.1, 4)[[i % 4 for i in range(windows)]]
    seed_effect, raw = rng.normal(0, 0.02, len(seeds)), {}  # shared by both arms (paired), as the file effect
    for name, extra in (("a", shift), ("b", 0.0)):
        per_seed = []
        for s in range(len(seeds)):
            base = 2.0 + file_effect + seed_effect[s] + rng.normal(0, 0.01, windows) + extra
            bins = np.repeat(base[:, None], 8, 1)
            per_seed.append({"loss": {256: base, 512: base + 0.01}, "bins": bins, "retrieval": {}})
        raw[name] = per_seed
    arms = {n: design.Arm(n, "rope", "scaling") for n in raw}
    return length_study.summary.Results(study, arms, raw, files)


def test_stated_comparisons_are_seed_level_and_holm_corrected_together():
    from models.studies.length import report
    from models.studies.seed_intervals import SeedBootstrap, holm

    results = _two_arm_results(0.3)
    found = length_study.summary.compare(results, [("a", "b", 256), ("a", "b", 512), ("b", "b", 512)])
    x, y = results.losses("a", 256), results.losses("b", 256)
    expected = SeedBootstrap(3, 24, clusters=results.sources, draws=400, seed=0).difference(x, y)
    assert found[0]["test"] == expected and expected.units == 3 and "4 sample clusters" in expected.method
    assert found[0]["difference"].mean == pytest.approx(float((x - y).mean()), abs=1e-12)  # float64 means
    lines = report.correction_lines(found)
    assert lines[0] == "## Multiple comparisons" and "Holm's step-down" in lines[2]
    adjusted = holm([c["test"].p_value for c in found])
    assert lines[6] == f"| a - b at 256 | {found[0]['test'].p_value:.2g} | {adjusted[0]:.2g} |"
    assert lines[-2] == "Significant after the correction: a - b at 256; a - b at 512."  # b - b: p = 1
    one_seed = _two_arm_results(0.3, seeds=(0,))
    assert report.correction_lines(length_study.summary.compare(one_seed, [("a", "b", 256)])) == []


def test_results_rebuilt_from_the_json_cells_give_the_same_intervals():
    results = _two_arm_results(0.1)
    cells = json.loads(json.dumps(length_study.cells(results)))  # as the page's json holds them
    again = length_study.summary.from_cells(results.study, results.arms, cells, results.sources)
    assert again.test("a", "b", 512) == results.test("a", "b", 512) and again.loss("a", 256) == results.loss("a", 256)
    assert again.break_position("a") == results.break_position("a") is None


# -- the streaming study (rolling caches; their exactness: tests/test_rolling_cache.py) ----------------------


def test_streaming_summary_states_known_differences_and_keeps_per_seed_means():
    from models.studies.length import streaming
    from models.studies.seed_intervals import SeedBootstrap, holm

    study = replace(streaming.study_of(False), seeds=(0, 1, 2), windows=40, draws=300)
    rng = np.random.default_rng(0)
    shifts = {"full attention": 0.3, "rolling, sinks 0": 0.0, "rolling, sinks 4": 0.0}  # full: 0.3 nats worse
    raw = {
        s: {a: 2.0 + shift + rng.normal(0, 0.05, (40, study.longest)) for a, shift in shifts.items()} for s in (0, 1, 2)
    }
    sources = [f"f{i % 5}.py" for i in range(40)]  # 5 source files
    summary = streaming.summarise(study, raw, sources)
    full = summary["differences"]["rolling, sinks 0 - full attention"]
    assert full["verdict"] == "lower" and -0.32 < full["difference"][0] < -0.28 and full["units"] == 3
    cells = {a: np.array(summary["cells"][a][study.longest]) for a in streaming.ARMS}
    test = SeedBootstrap(3, 40, clusters=sources, draws=study.draws, seed=0).difference(
        cells["rolling, sinks 0"], cells["full attention"]
    )  # the seed-level interval, windows clustered by file; the three differences Holm-corrected together
    p = [summary["differences"][f"{a} - {b}"]["p_value"] for a, b in streaming.PAIRS]
    assert full["difference"] == list(test.interval) and full["holm_p"] == holm(p)[1] and full["holm_p"] < 0.05
    assert summary["differences"]["rolling, sinks 4 - rolling, sinks 0"]["verdict"] == "no difference shown"
    assert summary["windows"]["sources"] == sources
    by_seed = streaming.differences({a: v.mean(1, keepdims=True) for a, v in cells.items()}, None, study.draws)
    assert by_seed["rolling, sinks 0 - full attention"]["method"] == "t over seeds"  # only per-seed means known
    assert summary["per_seed"]["full attention"][1][study.context] == pytest.approx(
        raw[1]["full attention"][:, :256].mean()
    )
    assert len(summary["curves"]["rolling, sinks 4"]) == study.longest // evaluate.BIN
    # the json's cells are the [seeds, windows] arrays the intervals come from: a reader recomputes them
    cells = np.array(summary["cells"]["full attention"][study.longest])
    assert cells.shape == (3, 40)
    redo = Bootstrap(3, 40, study.draws, seed=0).interval(cells)
    assert list(redo) == summary["loss"]["full attention"][study.longest]


def test_streaming_sinks_sentence_follows_the_interval():
    from models.studies.length.streaming import _sinks_reading

    window = (-0.556, -0.719, -0.393)  # the rolling cache's gain over full attention
    negligible = _sinks_reading((1.5e-05, -1.72e-04, 2.03e-04), window, 1024)
    assert "no difference shown" in negligible and "under 1/2700 " in negligible  # 0.556 / 2.03e-4 = 2739, floored
    assert "higher with them" in _sinks_reading((0.01, 0.005, 0.02), window, 1024)  # excludes 0: the direction
    wide = _sinks_reading((0.01, -0.05, 0.06), window, 1024)  # too wide to call negligible
    assert "no difference shown" in wide and "practical" not in wide


@pytest.mark.slow
def test_streaming_study_runs_end_to_end(tmp_path):
    from models.studies.length import streaming

    page = streaming.run(tmp_path / "out", quick=True, root=tmp_path / "runs").read_text()
    assert "rolling, sinks 4" in page and "Holm's step-down" in page
    data = json.loads((tmp_path / "out" / "streaming.json").read_text())
    assert streaming.page_from_json(data) == page  # byte for byte
    assert set(data["loss"]) == set(streaming.ARMS) and (tmp_path / "out" / "img" / "streaming.png").is_file()
    study, root = streaming.study_of(True), tmp_path / "runs"
    saved = streaming.evaluate_seed(study, root, 0)  # reused: the same checkpoint and windows
    assert saved["seconds"] > 0 and saved["settings"]["windows"] == study.windows
    fewer = streaming.evaluate_seed(
        replace(study, windows=study.windows - 2), root, 0
    )  # other windows: evaluated again
    assert fewer["arms"]["full attention"].shape[0] == study.windows - 2
    assert fewer["settings"]["checkpoint"] == saved["settings"]["checkpoint"]


# the models of a run folder written before the study's schemes left GPTConfig (commit 3371a2d): per preset, the
# sha256 (first 16 hex digits) of the state dict's "key:shape" list and the mean squared float64 logit of a
# fixed input after torch.manual_seed(0), computed then with GPT(gpt.STUDY_PRESETS[preset])
BEFORE_THE_MOVE = {
    "lm-alibi": ("599e096f803afb2a", 0.048912888006605336),
    "lm-learned": ("0e8482edf34cd096", 0.053252412974977334),
    "lm-linear": ("599e096f803afb2a", 0.053498117072388385),
    "lm-nope": ("599e096f803afb2a", 0.04858132667290454),
    "lm-rope": ("599e096f803afb2a", 0.04860549846095157),
    "lm-rope-ntk4": ("599e096f803afb2a", 0.04861094200736991),
    "lm-rope-pi4": ("599e096f803afb2a", 0.04861775722183777),
    "lm-rope-yarn4": ("599e096f803afb2a", 0.04861016564582328),
    "lm-sinusoidal": ("599e096f803afb2a", 0.04750176053710383),
    "lm-t5": ("cd3dbf95d816e9f6", 0.04858899569151598),
}


@pytest.mark.parametrize("preset", sorted(BEFORE_THE_MOVE))
def test_trainer_builds_the_study_models_saved_runs_hold(preset):
    import hashlib

    from models.training.tasks import TextTask

    torch.manual_seed(0)
    model = TextTask.from_run({"preset": preset, "context": 256, "seed": 0}).build().eval()  # how load_trained builds
    sd = model.state_dict()
    signature = hashlib.sha256(";".join(f"{k}:{tuple(v.shape)}" for k, v in sd.items()).encode()).hexdigest()[:16]
    idx = torch.arange(40)[None] * 7 % 256
    with torch.no_grad():
        checksum = float(model.double()(idx).square().mean())
    # the same weights (same draws, same order) and the same float64 function: equal but for summation order
    # (a few thousand float64 roundings, u = 1.1e-16: below 1e-12 relative)
    assert (signature, checksum) == (BEFORE_THE_MOVE[preset][0], pytest.approx(BEFORE_THE_MOVE[preset][1], rel=1e-12))


def test_the_streaming_page_regenerates_from_its_json():
    from models.studies.length import streaming

    root = Path(__file__).resolve().parents[1] / "docs" / "experiments"
    data = json.loads((root / "streaming.json").read_text())
    assert streaming.page_from_json(data) == (root / "streaming.md").read_text()  # byte for byte


def test_the_published_length_page_regenerates_from_its_json():
    root = Path(__file__).resolve().parents[1] / "docs" / "experiments"
    data = json.loads((root / "length.json").read_text())
    assert length_study.markdown(data) == (root / "length.md").read_text()  # byte for byte


def test_first_key_mass_sees_a_sink_and_uniform_attention():
    import torch.nn.functional as F

    from models.studies.length.sinks import FirstKeyMass, first_key_mass

    torch.manual_seed(0)
    B, H, S, D = 2, 3, 8, 4
    q = torch.zeros(B, H, S, D)  # equal scores: uniform over the visible keys
    k, v = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    with FirstKeyMass() as spy:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = sum(1 / (i + 1) for i in range(1, S)) / (S - 1)  # query i sees i + 1 keys
    assert spy.mass == pytest.approx([expected]) and spy.uniform == pytest.approx([expected])
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))  # the call is unchanged
    sink = torch.zeros(B, H, S, D)
    sink[..., 0], k2 = 1.0, torch.zeros(B, H, S, D)
    k2[:, :, 0, 0] = 50.0  # key 0 takes every query's attention
    with FirstKeyMass() as spy:
        F.scaled_dot_product_attention(sink, k2, v, attn_mask=torch.ones(S, S, dtype=torch.bool).tril())
    assert spy.mass[0] > 0.99 and spy.uniform[0] == pytest.approx(expected)
    from models.studies.length.positions import STUDY_PRESETS

    model = STUDY_PRESETS["lm-rope"].build().eval()  # one value per layer of a real model
    found = first_key_mass(model, torch.randint(0, 256, (1, 32)))
    assert len(found["mass"]) == model.config.depth and all(0 < m < 1 for m in found["mass"])
