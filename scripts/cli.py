"""What the command lines share: a person's mistake is one line on stderr and a non-zero exit, never a traceback.

- :class:`Parser`: ``argparse.ArgumentParser`` whose usage errors (argparse's own and those a script
  finds, ``parser.error``) are one line, ``prog: error: message``, exit status 2.
- :func:`fail`: a failure while working (a checkpoint that cannot be read, a file that cannot be
  written): one line, exit status 1.
- argument types (``type=``) that refuse what would silently become a default or a wrong result:
  :func:`positive_int` (a zero is not "the default"), :func:`finite_float` (``nan``, ``inf``).
- :func:`choices`: a comma list of known names (an unknown one is refused, never "measured nothing").
- :func:`out_folder`, :func:`out_file`: an output path checked before any work (not a file where a
  folder goes, not under a file, a file type that can be written).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import NoReturn

__all__ = ["Parser", "choices", "fail", "finite_float", "out_file", "out_folder", "positive_int"]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (``prog: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help: usage)\n")


def fail(prog: str, message: str, status: int = 1) -> NoReturn:
    """One line on stderr, then exit with ``status`` (1: the work failed; 2 is :meth:`Parser.error`'s)."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(status)


def positive_int(text: str) -> int:
    """``type=`` of a count: an int >= 1 (``0`` is refused, never read as "the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def finite_float(text: str) -> float:
    """``type=`` of a real setting: a finite number (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def choices(parser: argparse.ArgumentParser, flag: str, text: str, known) -> list[str]:
    """The names of a comma list ``text`` (``"dit,llm"``), each one of ``known``, or a usage error naming ``flag``."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "empty"
        parser.error(f"{flag}: {what}; expected a comma list of {list(known)}")
    return names


def _file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is a file (then ``path`` cannot be made), else ``None``."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def out_folder(parser: argparse.ArgumentParser, flag: str, path: str | Path) -> Path:
    """``path`` as the folder an output goes into, or a usage error naming ``flag`` (before any work)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        parser.error(f"{flag}: {path} is a file, a folder is expected")
    if (above := _file_above(path)) is not None:
        parser.error(f"{flag}: {path} lies under the file {above}, a folder is expected")
    return path


def out_file(
    parser: argparse.ArgumentParser, flag: str, path: str | Path, suffixes: tuple[str, ...] | None = None
) -> Path:
    """``path`` as a file to write, or a usage error naming ``flag``: not a folder, not under a file, and
    (given ``suffixes``) ending in one of them (the file types the writer knows)."""
    path = Path(path)
    if path.is_dir():
        parser.error(f"{flag}: {path} is a folder, a file name is expected")
    if (above := _file_above(path)) is not None:
        parser.error(f"{flag}: {path} lies under the file {above}")
    if suffixes is not None and path.suffix.lower() not in suffixes:
        parser.error(f"{flag}: {path} has the extension {path.suffix or '(none)'!r}, expected one of {suffixes}")
    return path
