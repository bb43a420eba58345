"""Node-wide file locks (``fcntl.flock``) shared by every process using one cache directory.

flock locks belong to an open file description, so two opens of the same lock file conflict
even inside one process (threads are covered too), and the kernel releases them when the
holder dies, ``kill -9`` included — no stale lock files to clean up. A holder that is alive but
stuck is another matter: a wait with a limit (``FileLock(wait_s=...)``) ends in one error naming
the holder's pid.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from typing import Callable

from cache.errors import CacheLockError

_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class FileLock:
    """A lock file held shared or exclusive.

    An exclusive holder writes its pid into the lock file, so a process kept waiting can name it
    (:meth:`holder`). Waits are for ever by default; with ``wait_s`` a wait ends in
    :class:`CacheLockError` once the holder has shown no progress for that long.

    Args:
        path: lock file path; created (empty) if missing. On a read-only folder an existing lock
            file is opened read-only (``flock`` needs no write access), so readers of a read-only
            cache still see each other's locks.
        shared: take ``LOCK_SH`` (many holders) instead of ``LOCK_EX`` (one holder).
        wait_s: how long ``with lock:`` waits without progress before it raises (``None`` = for ever).
        progress: a cheap reading of the holder's work (e.g. the size of the file it writes); any
            change restarts the ``wait_s`` clock. ``None`` = the wait is a plain time limit.
    """

    def __init__(self, path: str, shared: bool = False, wait_s: float | None = None,
                 progress: Callable[[], object] | None = None):
        self.path = path
        self.shared = shared
        self.wait_s, self.progress = wait_s, progress
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object currently holds the lock."""
        return self._fd is not None

    def acquire(self, blocking: bool = True, timeout_s: float | None = None) -> bool:
        """Take the lock.

        Args:
            blocking: wait for the lock; ``False`` returns at once.
            timeout_s: with ``blocking``, give up after this many seconds (polls every 50 ms).

        Returns:
            ``True`` if the lock is now held, ``False`` if it was busy (non-blocking or timed out).

        Raises:
            OSError: the lock file is missing and cannot be created (e.g. ``EROFS`` on a read-only mount).
        """
        if self._fd is not None:
            raise RuntimeError(f"lock {self.path} is already held by this object")
        fd = _open_lock_file(self.path)
        op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        try:
            if blocking and timeout_s is None:
                fcntl.flock(fd, op)
            else:
                deadline = time.monotonic() + (timeout_s or 0.0)
                while True:
                    try:
                        fcntl.flock(fd, op | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if not blocking or time.monotonic() >= deadline:
                            os.close(fd)
                            return False
                        time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if not self.shared:
            _record_holder(fd)
        return True

    def wait(self) -> None:
        """Take the lock, waiting while its holder makes progress (see the class doc).

        Raises:
            CacheLockError: held by another process without progress for ``wait_s`` seconds.
        """
        if self.wait_s is None:
            self.acquire()
            return
        seen, quiet_since = self._progress(), time.monotonic()
        while not self.acquire(timeout_s=min(1.0, self.wait_s)):
            now, value = time.monotonic(), self._progress()
            if value != seen:
                seen, quiet_since = value, now
            elif now - quiet_since >= self.wait_s:
                pid = self.holder()
                who = f"pid {pid}" if pid else "another process"
                state = "" if pid is None else " (alive)" if _alive(pid) else " (gone)"
                raise CacheLockError(f"lock {self.path} is held by {who}{state}, with no progress for {self.wait_s} s; "
                                    f"if that process is stuck, stop it (kill {pid or 'PID'}); if it is only slow, "
                                    "raise cache.fetch_wait_s", pid)

    def _progress(self) -> object:
        return self.progress() if self.progress is not None else None

    def holder(self) -> int | None:
        """The pid an exclusive holder recorded in the lock file, or ``None``."""
        try:
            with open(self.path, encoding="ascii") as f:
                text = f.read(32).strip()
        except (OSError, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() else None

    def release(self) -> None:
        """Drop the lock (no-op if not held)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "FileLock":
        self.wait()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _record_holder(fd: int) -> None:
    """Write this process's pid into the lock file it holds (skipped on a read-only lock file)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_lock_file(path: str) -> int:
    """File descriptor of the lock file at ``path``: created read-write, or read-only if it exists
    on a folder this process cannot write."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        if e.errno not in _READ_ONLY_ERRNOS or not os.path.exists(path):
            raise
        return os.open(path, os.O_RDONLY)


def is_locked(path: str) -> bool:
    """Whether any holder (any process, or another open in this one) has ``path`` locked."""
    if not os.path.exists(path):
        return False
    probe = FileLock(path)
    if probe.acquire(blocking=False):
        probe.release()
        return False
    return True
