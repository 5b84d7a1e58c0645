"""Train a reference model: ``python -m scripts.train [--model dit|video_dit|gpt] [--preset ...]``.

With no arguments it trains the tiny class-conditional image DiT on procedural shapes
(CPU, minutes) and writes a sample grid, a loss curve, a JSONL log and a checkpoint
into ``runs/dit``. Each model starts from its default run (``RUN_DEFAULTS`` in
``models/training/config.py``, shared with ``scripts.experiments``); flags replace
fields, and every value is checked before anything runs. ``--resume`` continues a run;
Ctrl-C or SIGTERM saves at the end of the current step and exits. A folder that holds a run
is never replaced without ``--overwrite``. Runs under ``torchrun --nproc_per_node N``
unchanged (DDP; ``--fsdp`` for FSDP2 over all ranks); ``--model video_dit --context-parallel P``
shards each video over P ranks (``--cp-method ring|ulysses``), the batch over the N / P groups;
``--checkpointing`` recomputes each block in the backward, ``--compile`` compiles each block
(``--compile-backend``, default inductor); docs/distributed.md has the recipes.

Exit status: 0 trained (or interrupted and saved, or a ``--resume`` at ``--steps`` already: a line says
nothing was left to train); 1 the work failed (a checkpoint that cannot be read or written, a ``--resume``
whose ``--steps`` is below the checkpoint's step, a diverged loss); 2 a usage error; 130 a forced stop.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from models.training.checkpoint import CheckpointError
from models.training.config import RUN_DEFAULTS, TrainConfig, run_config
from models.training.distributed import PeerFailed, plan
from models.training.run_checks import check_memory, check_run
from models.training.run_state import export_refusal
from models.training.rundir import RunFolderError
from models.training.trainer import TrainingDiverged, export_weights, train

from . import cli

# booleans, set by the flags below
FLAGS = (
    "resume",
    "overwrite",
    "allow_changes",
    "fsdp",
    "checkpointing",
    "compile",
    "packed",
    "causal",
    "progress",
    "report",
)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = cli.Parser(prog="scripts.train", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(RUN_DEFAULTS), default="dit")
    for field in dataclasses.fields(TrainConfig):
        if field.name == "model" or field.name in FLAGS:
            continue
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=None, help="default: the model's default run")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.safetensors")
    parser.add_argument("--overwrite", action="store_true", help="replace the run OUT holds (else refused)")
    parser.add_argument(
        "--allow-changes", action="store_true", help="resume with other optimisation settings (recorded in the log)"
    )
    parser.add_argument("--fsdp", action="store_true", help="shard with FSDP2 under torchrun")
    parser.add_argument(
        "--checkpointing", action="store_true", help="recompute each block's activations in the backward"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile each block (--compile-backend)")
    parser.add_argument(
        "--packed", action="store_true", help="image DiT: mixed sizes and aspects packed per step (docs/packing.md)"
    )
    parser.add_argument(
        "--causal", action="store_true", help="video DiT: frame-causal, one noise level per frame (diffusion forcing)"
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        help="write OUT's run (either format) as one safetensors file for inference, then exit (FILE may be an "
        "earlier export, never a training checkpoint: the run's own or another's)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-report", action="store_true", help="no validation, samples or loss curve")
    args = parser.parse_args(argv)
    if args.compile_backend is not None and not args.compile:  # the default named too: a flag is never ignored
        parser.error(f"--compile-backend {args.compile_backend}: used only with --compile (pass both, or neither)")
    values = {k: v for k, v in vars(args).items() if v is not None and k in TrainConfig.__dataclass_fields__}
    values |= {"progress": not args.no_progress, "report": not args.no_report}
    try:
        cfg = run_config(**values)
        # what the model cannot take (its preset, a side the patch does not divide) and what the machine cannot hold
        task, world = check_run(cfg), int(os.environ.get("WORLD_SIZE", 1))
        check_memory(cfg, task, world=world)
        plan(cfg, task, world)  # the (dp, cp) mesh: every rank refuses the same layout, before any collective
    except ValueError as err:  # a nonsense setting: one line and exit status 2, before anything runs
        parser.error(str(err))
    cli.out_folder(parser, "--out", cfg.out)
    if args.export:  # an export never replaces training state (the run's own checkpoint, or any other)
        cli.out_file(parser, "--export", args.export)
        if (refusal := export_refusal(cfg.out, args.export)) is not None:
            parser.error(f"--export {args.export} {refusal}")
    return cfg


def main(argv: list[str] | None = None) -> None:
    export = argparse.ArgumentParser(add_help=False)
    export.add_argument("--export")
    export.add_argument("--out")
    wanted = export.parse_known_args(argv)[0]
    if wanted.export:  # no training: the run of --out (parse_args checks the flags) consolidated into one file
        cfg = parse_args(argv)
        try:
            print(f"exported: {export_weights(cfg.out, wanted.export)}")
        except (CheckpointError, OSError) as err:
            cli.fail("scripts.train", err)
        return
    try:
        result = train(parse_args(argv))
    except (CheckpointError, RunFolderError, TrainingDiverged, PeerFailed) as err:  # for a person, not a traceback
        cli.fail("scripts.train", err)
    except OSError as err:  # the run folder or a file in it cannot be written (permissions, disk full, size limit)
        cli.fail("scripts.train", f"cannot write the run: {err}")
    except KeyboardInterrupt:  # a second Ctrl-C before the loop (the trainer handles those in and after it)
        _stopped("the last checkpoint written is kept")
    if result.get("unsaved"):
        saved = "no checkpoint" if result["step"] is None else f"the checkpoint of step {result['step']} kept"
        _stopped(f"{saved}: {result['out']}")
    if result.get("nothing_to_train"):
        print(f"nothing to train: {result['out']} had done its {result['step']} steps already (--steps: train longer)")
        return
    state = "interrupted, saved" if result["interrupted"] else "done"
    print(f"{state} at step {result['step']}: {result['out']}")


def _stopped(what: str) -> None:
    """A forced stop (a second Ctrl-C): one line on stderr, exit status 130 (128 + SIGINT), as shells report it."""
    print(f"scripts.train: stopped at once (Ctrl-C twice), the last state unsaved: {what}", file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
    main()
