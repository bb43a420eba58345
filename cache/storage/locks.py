"""Node-wide file locks (``fcntl.flock``) shared by every process using one cache directory.

flock locks belong to an open file description, so two opens of the same lock file conflict
even inside one process (threads are covered too), and the kernel releases them when the
holder dies, ``kill -9`` included — no stale lock files to clean up.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time

_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class FileLock:
    """A lock file held shared or exclusive.

    Args:
        path: lock file path; created (empty) if missing. On a read-only folder an existing lock
            file is opened read-only (``flock`` needs no write access), so readers of a read-only
            cache still see each other's locks.
        shared: take ``LOCK_SH`` (many holders) instead of ``LOCK_EX`` (one holder).
    """

    def __init__(self, path: str, shared: bool = False):
        self.path = path
        self.shared = shared
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
        return True

    def release(self) -> None:
        """Drop the lock (no-op if not held)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


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
