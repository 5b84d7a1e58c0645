"""Validate the sample metrics on known renders: ``python -m scripts.validate_metrics [--root runs/resolution]``.

Loads (or trains, about 250 steps on the CPU) the resolution study's shape classifier from
``ROOT/classifier.pt``, measures it on clean, stretched, fragmented, blurred and empty renders
(:mod:`models.studies.vision.validation`), writes ``OUT/metric_validation.json`` and prints the
markdown table the resolution page shows under "Validating the metrics".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from models.studies.vision.classifier import ClassifierConfig, load_or_train
from models.studies.vision.metrics import reference
from models.studies.vision.validation import validation_markdown, validation_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs/resolution", help="the study root holding classifier.pt")
    parser.add_argument("--out", default="docs/experiments", help="where metric_validation.json goes")
    parser.add_argument("--samples", type=int, default=128, help="renders per condition")
    parser.add_argument("--resolution", type=int, default=32, help="pixels (the training resolution)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    config = ClassifierConfig()
    classifier = load_or_train(Path(args.root) / "classifier.pt", config)
    table = validation_table(classifier, reference(args.resolution), n=args.samples, resolution=args.resolution)
    out = Path(args.out) / "metric_validation.json"
    record = {
        "command": "python -m scripts.validate_metrics",
        "classifier": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(config).items()},
        "resolution": args.resolution,
        "table": table,
        "wall_seconds": round(time.perf_counter() - start),
        "torch": torch.__version__,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(validation_markdown(table), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
