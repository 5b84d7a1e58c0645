"""The command lines under a person's mistakes: one line on stderr naming the argument and a non-zero exit
(2: a usage error), never a traceback, and never a silently wrong result (a blank grid, noise, a zero read
as "the default", a flag ignored). Run in-process (``main(argv)``): no interpreter start per case."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import one_torch_thread

import axial_rope as ar
from models.training.config import run_config
from models.training.trainer import Run
from scripts import bench, experiments, sample, train

_one_thread = one_torch_thread()


def refused(main, argv: list[str], capsys, *words: str, status: int = 2) -> str:
    """Run ``main(argv)``; assert it exits with ``status`` after one line on stderr holding ``words``."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert stop.value.code == status and len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    """Checkpoints of step 0 (no training) of the tiny image and video DiTs: what ``scripts.sample`` loads."""
    out = {}
    for model, sizes in (("dit", {"resolution": 16}), ("video_dit", {"resolution": 8, "frames": 2})):
        folder = tmp_path_factory.mktemp(model)
        Run(run_config(model, batch_size=2, out=str(folder), progress=False, report=False, **sizes)).save()
        out[model] = str(folder)
    return out


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


# -- scripts.sample ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--cfg", "nan"], ["--cfg", "finite"]),  # before: a blank grid, exit 0
        (["--cfg", "inf"], ["--cfg", "finite"]),
        (["--steps", "0"], ["--steps", ">= 1"]),  # before: the noise written as the sample
        (["--per-class", "0"], ["--per-class"]),  # before: ZeroDivisionError
        (["--frames", "0"], ["--frames"]),  # before: the training frame count
        (["--frames", "-2"], ["--frames"]),  # before: RuntimeError, negative dimension
        (["--resolution", "0"], ["--resolution"]),  # before: the training resolution
        (["--resolution", "-32"], ["--resolution"]),
    ],
)
def test_sample_refuses_nonsense_before_loading(argv, words, capsys, tmp_path):
    refused(sample.main, ["--checkpoint", str(tmp_path / "none"), *argv], capsys, *words)


def test_sample_refuses_what_the_checkpoint_cannot_take(runs, capsys, tmp_path, a_file):
    image, video = ["--checkpoint", runs["dit"]], ["--checkpoint", runs["video_dit"]]
    refused(sample.main, [*image, "--resolution", "30"], capsys, "--resolution 30", "patch 4")
    refused(sample.main, [*video, "--resolution", "7"], capsys, "--resolution 7", "patch 2")  # (1, 2, 2)
    refused(sample.main, [*image, "--frames", "4"], capsys, "--frames", "video")  # before: ignored
    refused(sample.main, [*image, "--out", str(tmp_path / "grid.bogus")], capsys, "--out", "'.bogus'")
    refused(sample.main, [*video, "--out", str(tmp_path / "video.jpg")], capsys, "--out", "'.jpg'")  # no frames
    refused(sample.main, [*image, "--out", str(tmp_path)], capsys, "--out", "is a folder")
    refused(sample.main, [*image, "--out", str(a_file / "grid.png")], capsys, "--out", "under the file")
    refused(sample.main, ["--checkpoint", str(tmp_path / "none")], capsys, "no checkpoint", status=1)


def test_sample_that_cannot_write_is_one_line(runs, capsys):
    argv = ["--checkpoint", runs["dit"], "--steps", "1", "--per-class", "1", "--out", "/proc/axial_rope/grid.png"]
    refused(sample.main, argv, capsys, "/proc/axial_rope", status=1)


def test_sample_pipeline_samples_a_video_checkpoint(runs, monkeypatch):
    """``--pipeline`` with a video DiT: the diffusers video pipeline, the same videos as the Euler loop
    (before: the flag was ignored)."""
    written = []
    monkeypatch.setattr(sample, "save_gif", lambda videos, out: written.append(videos) or out)
    argv = ["--checkpoint", runs["video_dit"], "--steps", "2", "--per-class", "1", "--cfg", "2"]
    sample.main(argv)
    sample.main([*argv, "--pipeline"])
    own, piped = written
    assert own.shape == piped.shape == (4, 3, 2, 8, 8)
    torch.testing.assert_close(piped, own, atol=1e-5, rtol=1e-5)


# -- scripts.train -------------------------------------------------------------------------------


# should a refusal fail to happen, the run stays one tiny step
TINY_RUN = ["--steps", "1", "--batch-size", "2", "--no-progress", "--no-report"]


def test_train_refuses_settings_the_model_cannot_take(capsys, tmp_path, a_file):
    out = [*TINY_RUN, "--out", str(tmp_path / "run")]
    refused(train.main, ["--resolution", "30", *out], capsys, "input_size 30", "patch_size 4")
    video = ["--model", "video_dit", "--resolution", "15", *out]  # patch (1, 2, 2); before: a crash at step 1
    refused(train.main, video, capsys, "resolution 15", "patch_size (1, 2, 2)")
    refused(train.main, ["--preset", "bogus", *out], capsys, "preset", "'bogus'")
    refused(train.main, [*TINY_RUN, "--out", str(a_file)], capsys, "--out", "is a file")
    refused(train.main, [*TINY_RUN, "--out", str(a_file / "run")], capsys, "--out", "under the file")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_train_refuses_a_context_beyond_the_machine(capsys, tmp_path):
    """``--context 100000``: the attention scores alone (B H S S floats) are terabytes; refused with the estimate."""
    argv = [
        "--model",
        "gpt",
        "--context",
        "100000",
        "--steps",
        "1",
        "--no-progress",
        "--no-report",
        "--out",
        str(tmp_path),
    ]
    line = refused(train.main, argv, capsys, "--context")
    assert "GiB" in line and "B*H*S*S" in line
    assert train.parse_args(["--model", "gpt"]).context == 256  # the default run passes


def test_train_into_a_folder_that_cannot_be_made_is_one_line(capsys):
    argv = [*TINY_RUN, "--resolution", "16", "--out", "/proc/axial_rope_run"]
    refused(train.main, argv, capsys, "/proc/axial_rope_run", status=1)


# -- scripts.bench (and --packed) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--shapes", "bogus"], ["--shapes", "'bogus'"]),  # before: KeyError
        (["--modes", "bogus"], ["--modes", "'bogus'"]),  # before: measured nothing, exit 0
        (["--repeat", "-3"], ["--repeat"]),  # before: StatisticsError
        (["--repeat", "0"], ["--repeat"]),  # before: the default repeat
        (["--threads", "-1"], ["--threads"]),  # before: RuntimeError
        (["--threads", "0"], ["--threads"]),  # before: the default threads
        (["--packed", "--images", "0"], ["--images"]),  # before: ValueError from forward_packed
        (["--packed", "--images", "-1"], ["--images"]),
        (["--packed", "--bucket", "0"], ["--bucket"]),  # before: ZeroDivisionError
        (["--packed", "--repeat", "0"], ["--repeat"]),
        (["--packed", "--threads", "-1"], ["--threads"]),
    ],
)
def test_bench_refuses_nonsense(argv, words, capsys):
    refused(bench.main, argv, capsys, *words)


def test_bench_refuses_outputs_under_a_file(capsys, a_file):
    refused(bench.main, ["--out", str(a_file)], capsys, "--out", "is a file")
    refused(bench.main, ["--packed", "--json", str(a_file / "x.json")], capsys, "--json", "under the file")


def test_export_never_replaces_a_training_checkpoint(capsys, tmp_path):
    """Issue 39, item 5: ``--export RUN/checkpoint.safetensors --out RUN`` replaced the run's checkpoint (AdamW
    state included) by the export, exit 0; ``--resume`` then failed. Refused now, nothing written."""
    run, other = tmp_path / "run", tmp_path / "other"
    train.main([*TINY_RUN, "--resolution", "16", "--out", str(run)])  # one step: AdamW's state in the checkpoint
    other.mkdir()
    (other / "checkpoint.safetensors").write_bytes((run / "checkpoint.safetensors").read_bytes())  # another run's
    kept = {path: path.read_bytes() for path in (run / "checkpoint.safetensors", other / "checkpoint.safetensors")}
    own = run / "checkpoint.safetensors"
    refused(train.main, ["--out", str(run), "--export", str(own)], capsys, "--export", str(own), "own checkpoint")
    (run / "checkpoint.dcp").symlink_to("checkpoint-dcp-000001-x")  # a DCP run's link (dangling: only its name counts)
    cases = [
        (tmp_path / "." / "run" / "checkpoint.safetensors", "the run's own checkpoint"),  # the same file, spelt apart
        (run / "checkpoint.dcp", "the run's own checkpoint"),
        (run / "checkpoint-dcp-000001-x" / "model.safetensors", "the run's own checkpoint"),
        (other / "checkpoint.safetensors", "holds a training checkpoint"),
        (run / "log.jsonl", "is a file of the run"),
    ]
    for path, words in cases:
        refused(train.main, ["--out", str(run), "--export", str(path)], capsys, "--export", str(path), words)
    assert all(path.read_bytes() == data for path, data in kept.items())
    (run / "checkpoint.dcp").unlink()
    exported = tmp_path / "model.safetensors"
    for _ in range(2):  # an earlier export is replaced
        train.main(["--out", str(run), "--export", str(exported)])
    train.main([*TINY_RUN, "--steps", "2", "--resolution", "16", "--resume", "--out", str(run)])
    assert "done at step 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [  # before: without --compile the backend was ignored, exit 0 after training
        (["--compile-backend", "bogus"], ["--compile-backend bogus", "only with --compile"]),
        (["--compile-backend", "inductor"], ["--compile-backend inductor", "only with --compile"]),
        (["--compile", "--compile-backend", "bogus"], ["compile_backend must be one of", "'bogus'"]),
    ],
)
def test_train_refuses_a_compile_backend_it_would_not_use(argv, words, capsys, tmp_path):
    refused(train.main, [*TINY_RUN, "--resolution", "16", *argv, "--out", str(tmp_path / "run")], capsys, *words)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="compile_backend must be the default 'inductor' without compile"):
        run_config("dit", compile_backend="aot_eager")  # the settings alone, as a library caller makes them


def test_train_resume_says_when_there_is_nothing_to_train(capsys, tmp_path):
    """Issue 39, item 11: ``--resume`` with fewer steps than the checkpoint's exited 0 without a word (and
    rewrote config.json with the smaller count). Fewer: an error, exit 1; as many: a line saying so, exit 0."""
    out = [*TINY_RUN[2:], "--resolution", "16", "--out", str(tmp_path)]  # TINY_RUN less its --steps
    train.main(["--steps", "2", *out])
    config = (tmp_path / "config.json").read_text()
    capsys.readouterr()
    refused(train.main, ["--steps", "1", "--resume", *out], capsys, "steps 1 is below the 2 steps", status=1)
    assert (tmp_path / "config.json").read_text() == config
    train.main(["--steps", "2", "--resume", *out])
    assert capsys.readouterr().out.startswith(f"nothing to train: {tmp_path} had done its 2 steps already")


def test_bench_refuses_an_unknown_provider_before_writing(capsys, tmp_path):
    """Before: ``--providers nosuchprovider`` timed only ``copy``, exit 0, and replaced benchmarks.md."""
    argv = ["--small", "--shapes", "dit", "--providers", "triton,nosuchprovider", "--out", str(tmp_path / "docs")]
    refused(bench.main, argv, capsys, "--providers", "'nosuchprovider'", "axial_rope torch (tables)")
    assert not (tmp_path / "docs").exists()
    # the list the check reads holds every provider a run can time (CPU here: both pairings, every mode)
    rope, pos = ar.AxialRoPE((4, 4)), ar.grid(2, 2)
    for pairing, mode in itertools.product(("interleaved", "half"), bench.MODES):
        shape = bench.Shape("tiny", 1, (2, 2), 1, 1, (4, 4), pairing)
        assert set(bench.providers(shape, rope, pos, "cpu", mode)) <= set(bench.PROVIDERS)


def test_experiments_refuses_an_out_that_is_a_file(capsys, a_file):
    """Before: ``experiments length --smoke --out FILE`` trained, then ended in a traceback writing FILE/img."""
    refused(experiments.main, ["length", "--smoke", "--out", str(a_file)], capsys, "--out", "is a file")
    refused(experiments.main, ["length", "--smoke", "--run-dir", str(a_file)], capsys, "--run-dir", "is a file")
