"""``python -m axial_rope.doctor``: the RoPE doctor on a live model, or the extrapolation map of a config.

    python -m axial_rope.doctor my_package.models:build [--size 4096] [--json report.json] [--picture map.png]
    python -m axial_rope.doctor --config path/to/config.json --size 131072

``TARGET`` is ``module:name``: a model, or a callable with no arguments returning a model or ``(model,
example_inputs)`` (importable from the current directory). With ``--config`` (and no ``TARGET``) the map is computed
from the config alone (no model is built). A user error ends with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from . import DoctorError, doctor, extrapolation_map

__all__ = ["main"]


def _fail(message: str) -> None:
    print(f"axial_rope.doctor: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _target(spec: str):
    """``module:name`` -> ``(model, example_inputs or None)``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        _fail(f"TARGET must be module:name (a model or a function returning one), got {spec!r}")
    sys.path.insert(0, str(Path.cwd()))
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        _fail(f"cannot import TARGET {spec!r}: {error}")
    import torch

    if not isinstance(found, torch.nn.Module) and callable(found):
        try:
            found = found()
        except Exception as error:  # a user's factory: whatever it raises, say it in one line
            _fail(f"TARGET {spec!r} raised {type(error).__name__}: {error}")
    model, inputs = found if isinstance(found, tuple) and len(found) == 2 else (found, None)
    if not isinstance(model, torch.nn.Module):
        _fail(f"TARGET {spec!r} gave {type(model).__name__}, not a torch.nn.Module (or (model, example_inputs))")
    return model, inputs


def _config(path: str) -> dict:
    file = Path(path)
    file = file / "config.json" if file.is_dir() else file
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        _fail(f"--config {path!r}: cannot read a JSON config: {error}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m axial_rope.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", help="module:name of a model (or of a function returning one)")
    parser.add_argument("--config", help="a config.json (or its folder) to map without a model (no TARGET)")
    parser.add_argument("--size", type=int, nargs="+", help="planned length, or tokens per sized axis")
    parser.add_argument("--train-size", type=int, nargs="+", help="trained tokens per sized axis, where unknown")
    parser.add_argument("--sinks", type=int, help="sink tokens of a streaming model (with --size)")
    parser.add_argument("--json", help="write the report as JSON to this file ('-': stdout)")
    parser.add_argument("--picture", help="draw the extrapolation map to this PNG")
    parser.add_argument("--no-autocast", action="store_true", help="skip the torch.autocast pass")
    args = parser.parse_args(argv)
    size = None if args.size is None else (args.size[0] if len(args.size) == 1 else tuple(args.size))
    train = None if args.train_size is None else (
        args.train_size[0] if len(args.train_size) == 1 else tuple(args.train_size))  # fmt: skip
    if args.sinks is not None and args.sinks < 1:
        _fail(f"--sinks must be >= 1, got {args.sinks}")
    try:
        if args.target is None:
            if args.config is None:
                _fail("give a TARGET (module:name) or --config (a config.json) to map")
            result = extrapolation_map(_config(args.config), size, train_size=train)
            if result is None:
                _fail("the config names no trained extent: pass --train-size")
            payload, text, picture = result.to_dict(), str(result), result
        else:
            if args.config is not None:
                _fail("--config maps a config without a model; with a TARGET the doctor reads the model's own config "
                      "(another one: doctor(model, config=...) in Python)")  # fmt: skip
            model, inputs = _target(args.target)
            report = doctor(model, None, size, example_inputs=inputs, train_size=train, sinks=args.sinks,
                            autocast=not args.no_autocast)  # fmt: skip
            payload, text, picture = report.to_dict(), str(report), report.map
    except (DoctorError, TypeError, ValueError) as error:
        _fail(str(error))
    if args.json == "-":
        print(json.dumps(payload, indent=2))
    else:
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps(payload, indent=2))
    if args.picture:
        if picture is None:
            _fail("no extrapolation map to draw (no trained extent: pass --train-size)")
        from .picture import draw

        draw(picture, args.picture)


if __name__ == "__main__":
    main()
