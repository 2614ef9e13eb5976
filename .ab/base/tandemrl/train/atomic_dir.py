"""Crash-safe folder handling: fsync, working folders, deletion through trash, sweeping up after crashes.

Working folders sit next to the folder they stand for and name the process that made them:
``.tmp-<name>-<pid>`` while a new folder is being written, ``.old-<name>-<pid>`` for a folder moved aside to
be replaced. A later process may delete those of its own pid or of a pid that is no longer alive.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"
_TRASH_PREFIX = ".trash-"
_WORKING_RE = re.compile(r"^(\.tmp-|\.old-)(.+)-(\d+)$")


# ------------------------------------------------------------------------------------------------ durability


def write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync there
        return
    fsync_file(path)


def fsync_tree(folder: Path) -> None:
    for dirpath, _, filenames in os.walk(folder, topdown=False):
        for filename in filenames:
            fsync_file(os.path.join(dirpath, filename))
        fsync_dir(dirpath)


# ------------------------------------------------------------------------------------------- working folders


def _working_path(root: Path, prefix: str, name: str) -> Path:
    return root / f"{prefix}{name}-{os.getpid()}"


def _split_working_name(entry: str) -> tuple[str, str, int] | None:
    """(prefix, name, pid) if `entry` names a working folder, else None."""
    match = _WORKING_RE.match(entry)
    return (match.group(1), match.group(2), int(match.group(3))) if match else None


def staging_path(root: Path, name: str) -> Path:
    """Where this process writes the new ``root/<name>`` before renaming it into place."""
    return _working_path(root, _TMP_PREFIX, name)


def moved_aside_from(entry: str) -> str | None:
    """The name the folder `entry` had before move_aside renamed it; None if `entry` is no such folder."""
    working = _split_working_name(entry)
    return working[1] if working and working[0] == _OLD_PREFIX else None


def clear(path: Path) -> None:
    """Delete `path` (a folder) if anything is there."""
    if os.path.lexists(path):
        shutil.rmtree(path)


def move_aside(root: Path, path: Path) -> Path | None:
    """Rename an existing `path` to its ``.old-`` working folder and return that; None if `path` is absent."""
    if not os.path.lexists(path):
        return None
    aside = _working_path(root, _OLD_PREFIX, path.name)
    clear(aside)
    os.replace(path, aside)
    return aside


def remove_dir(root: Path, path: Path) -> None:
    """Rename to .trash-* first (atomic), so a kill during the delete never leaves a half folder visible."""
    trash = root / f"{_TRASH_PREFIX}{path.name.lstrip('.')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def sweep_leftovers(root: Path, names: re.Pattern[str]) -> None:
    """Delete working folders for `names` left by this process or by dead ones, and any trash."""
    for entry in os.scandir(root):
        working = _split_working_name(entry.name)
        if working and names.match(working[1]) and (working[2] == os.getpid() or not pid_alive(working[2])):
            remove_dir(root, root / entry.name)
        elif entry.name.startswith(_TRASH_PREFIX):
            shutil.rmtree(root / entry.name, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process there: assume alive
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:  # ProcessLookupError included
        return False
    return True
