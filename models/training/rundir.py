"""The run folder: one writer at a time, no run replaced by accident, a log that matches its checkpoint.

- :class:`RunLock`: an exclusive lock on ``OUT/.lock`` (``flock``, released by the kernel when
  the process dies, so a killed run never leaves a stale lock); a second run into the folder
  is refused while the first holds it.
- :func:`start_fresh`: a fresh run into a folder that holds a run is refused unless told to
  replace it (``overwrite``), with the command that resumes it instead.
- :func:`truncate_log`: on resume the log keeps only the records up to the checkpoint's step
  (a killed run logged steps its checkpoint does not hold), and drops a cut-off last line.
- :func:`read_log`: the records of a log, skipping a line cut off by a kill.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["RUN_FILES", "RunFolderError", "RunLock", "read_log", "start_fresh", "truncate_log"]

# the files that make a folder hold a run (a fresh run there is refused without overwrite)
RUN_FILES = ("checkpoint.safetensors", "checkpoint.dcp", "log.jsonl", "config.json")  # .dcp: FSDP2 runs'
# what a fresh run with overwrite removes: the run files and the pictures the old run drew
OLD_RUN_GLOBS = (*RUN_FILES, "loss.png", "samples*", "sample_*")


class RunFolderError(RuntimeError):
    """A run folder that this run may not write into: held by another run, or holding one."""


class RunLock:
    """``with RunLock(folder):`` holds the folder's lock, or raises :class:`RunFolderError` at once."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # no flock (Windows): an exclusive create, which a killed run leaves behind
            self._create_exclusive()
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # the holder before us may have removed the file as it let go: then we locked a stale inode
            if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            raise RunFolderError(self._busy_message()) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def _create_exclusive(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise RunFolderError(self._busy_message() + f" (if no run is, remove {self.path})") from None
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def _busy_message(self) -> str:
        try:
            holder = f" (pid {self.path.read_text().strip()})"
        except OSError:
            holder = ""
        return f"another run is training into {self.path.parent}{holder}: wait for it, or choose another --out"

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # while still held: nobody locks a file about to vanish
            os.close(self.fd)
            self.fd = None


def start_fresh(folder: str | Path, overwrite: bool) -> None:
    """Make ``folder`` ready for a fresh run: refuse one that holds a run unless ``overwrite`` (then clear it)."""
    folder = Path(folder)
    held = [name for name in RUN_FILES if (folder / name).exists()]
    if held and not overwrite:
        raise RunFolderError(
            f"{folder} holds a run ({', '.join(held)}): pass --resume to continue it, --overwrite to replace it, "
            "or choose another --out"
        )
    for pattern in OLD_RUN_GLOBS if overwrite else ():
        for path in folder.glob(pattern):
            if path.is_file():
                path.unlink()


def read_log(path: str | Path) -> list[dict]:
    """The records of a JSONL log; a line that is not a JSON object (cut off by a kill) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def truncate_log(path: str | Path, step: int) -> None:
    """Keep the log's records up to ``step`` (the checkpoint's), so a resumed run logs each step once."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [r for r in read_log(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
