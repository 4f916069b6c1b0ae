"""Output paths, checked before anything runs: a run must not train for an
hour and then die at its first save because a folder is read-only, sits under
a file, or cannot be made. One line names the flag, the path and the fix."""
import os

from ringtrain.common.errors import UsageError

# args attributes that name output directories, and output files
DIRS = ("checkpoint_dir", "log_dir", "out", "snapshot_dir")
FILES = ("summary_json", "dump_weights", "timeline")


def check_outputs(args):
    """Every output path among args' attributes exists and is writable, or can be created."""
    for attr in DIRS:
        if getattr(args, attr, None):
            writable_dir(flag(attr), getattr(args, attr))
    for attr in FILES:
        if getattr(args, attr, None):
            writable_file(flag(attr), getattr(args, attr).replace("{rank}", "0"))


def flag(attr):
    return "--" + attr.replace("_", "-")


def writable_dir(name, path):
    full = os.path.abspath(path)
    if os.path.exists(full):
        if not os.path.isdir(full):
            raise UsageError(f"{name} {path} is a file, not a directory: give a directory")
        if not os.access(full, os.W_OK | os.X_OK):
            raise UsageError(f"{name} {path} is not writable{_read_only(full)}: give a writable directory")
        return
    parent = _nearest_existing(full)
    if not os.path.isdir(parent):
        raise UsageError(f"{name} {path} cannot be created: {parent} is a file: give another directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{name} {path} cannot be created: {parent} is not writable{_read_only(parent)}: "
                         "give a writable directory")


def writable_file(name, path):
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise UsageError(f"{name} {path} is a directory: give a file name")
    if os.path.exists(full) and not os.access(full, os.W_OK):
        raise UsageError(f"{name} {path} is not writable{_read_only(full)}: give a writable file")
    writable_dir(f"{name} {path}: its directory", os.path.dirname(full))


def parent_made(path):
    """`path`, after creating its directory if missing (checked at start-up)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    return path


def _nearest_existing(path):
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _read_only(path):
    try:
        return " (a read-only file system)" if os.statvfs(path).f_flag & os.ST_RDONLY else ""
    except OSError:
        return ""
