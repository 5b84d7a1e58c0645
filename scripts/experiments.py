"""Extrapolation experiments: ``python -m scripts.experiments resolution|length|frames|packing|streaming|streaming-video|pilot|grid [--smoke | --quick]``.

Each trains its model's default run once into ``runs/<model>`` (``--run-dir`` elsewhere) and
writes a table and pictures to ``docs/experiments/NAME.md``; ``length`` trains its study's
runs (every position scheme, several seeds) under ``runs/length``, resumably. A run folder is reused only
when its saved ``config.json`` matches the run in every field that changes the weights;
one holding another run is an error (remove it or pass ``--run-dir``). ``--smoke`` runs a
seconds-long version into scratch folders, to check that everything runs.
"""

from __future__ import annotations

from models.studies.experiments import EXPERIMENTS
from models.training.checkpoint import CheckpointError
from models.training.rundir import RunFolderError

from . import cli


def main(argv: list[str] | None = None) -> None:
    parser = cli.Parser(prog="scripts.experiments", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(EXPERIMENTS))
    parser.add_argument(
        "--smoke", "--quick", action="store_true", help="tiny sizes, seconds to a minute; results are meaningless"
    )
    parser.add_argument("--out", default=None, help="default: docs/experiments (smoke: runs/experiments_smoke)")
    parser.add_argument(
        "--run-dir", default=None, help="the training run's folder; default runs/<model>[_smoke] (length: runs/length)"
    )
    parser.add_argument("--workers", type=int, default=None, help="grid: processes of one thread (0: this one)")
    parser.add_argument(
        "--stage", choices=("pilot", "all", "page"), default="all",
        help="grid: the pilot's jobs only, every job, or none (the page from the cells done)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.name != "grid" and (args.workers is not None or args.stage != "all"):
        parser.error("--workers and --stage apply to the grid study only")
    extra = {"workers": args.workers, "stage": args.stage} if args.name == "grid" else {}
    # folders, checked before any training: a file there was a traceback once the study had run
    out = cli.out_folder(parser, "--out", args.out or ("runs/experiments_smoke" if args.smoke else "docs/experiments"))
    if args.run_dir is not None:
        cli.out_folder(parser, "--run-dir", args.run_dir)
    try:
        path = EXPERIMENTS[args.name](out, smoke=args.smoke, run_dir=args.run_dir, **extra)
    except (CheckpointError, RunFolderError) as err:  # a run folder holding another run: say which, and what to do
        cli.fail("scripts.experiments", err)
    except OSError as err:  # a folder or file that cannot be written (permissions, disk full)
        cli.fail("scripts.experiments", f"cannot write the results: {err}")
    print(path.read_text())


if __name__ == "__main__":
    main()
