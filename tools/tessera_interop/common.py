"""Errors, atomic output and progress shared by the interop commands."""
import os
import shutil
import signal
import sys
import tempfile


class Refusal(Exception):
    """Input the conversion cannot represent: one message, exit status 1, nothing written."""


def fail(prog, message):
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1


class Progress:
    """A line per 10% of the bytes written, for files large enough that it matters."""

    def __init__(self, what, total, out=sys.stderr):
        self.what, self.total, self.done, self.shown, self.out = what, total, 0, -1, out

    def add(self, n):
        self.done += n
        if self.total < (64 << 20):
            return
        tenth = self.done * 10 // max(self.total, 1)
        if tenth != self.shown:
            self.shown = tenth
            print(f"{self.what}: {self.done / 2**20:.0f} / {self.total / 2**20:.0f} MiB",
                  file=self.out, flush=True)


def check_target(path, force, kind):
    """Refuses to replace an existing file or directory unless --force."""
    if os.path.lexists(path) and not force:
        raise Refusal(f"'{path}' already exists; pass --force to replace it")
    if os.path.lexists(path) and kind == "file" and os.path.isdir(path):
        raise Refusal(f"'{path}' is a directory; name a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise Refusal(f"the directory of '{path}' does not exist")


def _fault_midwrite():
    """Test hook: TESSERA_FAULT_INJECT=interop-midwrite kills the process after the output is
    written under its temporary name, before the rename (what a crash or kill -9 would do)."""
    if os.environ.get("TESSERA_FAULT_INJECT") == "interop-midwrite":
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_file(path, write):
    """write(f) into a temporary file beside `path`, fsync, rename: never half a file at path."""
    parent = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            _fault_midwrite()
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        _fsync(parent)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_dir(path, fill):
    """fill(dir) into a temporary directory beside `path`, then rename it to `path` (an existing
    `path`, allowed by --force, is moved aside first and removed after)."""
    parent = os.path.dirname(os.path.abspath(path))
    tmp = tempfile.mkdtemp(prefix=os.path.basename(os.path.abspath(path)) + ".", suffix=".tmp",
                           dir=parent)
    try:
        fill(tmp)
        _fault_midwrite()
        for name in os.listdir(tmp):
            _fsync(os.path.join(tmp, name))
        os.chmod(tmp, 0o755)
        old = None
        if os.path.lexists(path):
            old = tmp + ".old"
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(parent)
        if old:
            shutil.rmtree(old) if os.path.isdir(old) else os.remove(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
