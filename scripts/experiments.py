"""Extrapolation experiments: ``python -m scripts.experiments resolution|length|frames [--smoke]``.

Each trains its model once (reusing ``runs/<model>`` when its checkpoint is there) and
writes a table and pictures to ``docs/experiments/NAME.md``. ``--smoke`` runs a
seconds-long version into a scratch folder, to check that everything runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from models.experiments import EXPERIMENTS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(EXPERIMENTS))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds; results are meaningless")
    parser.add_argument("--out", default=None, help="default: docs/experiments (smoke: runs/experiments_smoke)")
    args = parser.parse_args(argv)
    out = Path(args.out or ("runs/experiments_smoke" if args.smoke else "docs/experiments"))
    path = EXPERIMENTS[args.name](out, smoke=args.smoke)
    print(path.read_text())


if __name__ == "__main__":
    main()
