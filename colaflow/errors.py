"""How every colaflow command line reports a failure: one line saying what is wrong, no traceback."""
from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from typing import Callable


# what to do after an expected I/O failure, by errno
_NEXT = {errno.ENOSPC: "free space there or choose another folder", errno.EFBIG: "the file system (or this "
         "process's file size limit, ulimit -f) cannot hold so large a file: choose another folder", errno.EDQUOT: "free space there (disk quota) or "
         "choose another folder", errno.EROFS: "it is on a read-only file system: choose a writable folder",
         errno.EACCES: "check its permissions or choose another folder", errno.EPERM: "check its permissions or "
         "choose another folder"}


def explain(e: BaseException) -> str:
    """One-line description of ``e`` for a user.

    fsspec reports a missing *or unreachable* URL as ``FileNotFoundError(url)``, with the network
    error as its cause; the cause is named so "404" and "nothing listens on that port" differ. An
    I/O failure (no space, read-only, no permission, a time-out) names the path and the cause and
    says what to do.
    """
    if isinstance(e, FileNotFoundError):
        what = e.filename or (e.args[0] if e.args else "")
        cause = e.__cause__ or e.__context__
        reason = f" ({type(cause).__name__}: {cause})" if cause else ""
        return f"not found or unreachable: {what}{reason}; check the path or URL and that its server is running"
    if isinstance(e, TimeoutError):
        return (f"a network read timed out ({type(e).__name__}{f': {e}' if str(e) else ''}); check that the "
                "server answers, or raise cache.timeout_s (COLAFLOW_CACHE_TIMEOUT_S)")
    if isinstance(e, OSError) and e.errno is None and str(e):
        return str(e)  # colaflow's own storage errors: their message already names the path and the cause
    io = io_cause(e)
    if io is not None:
        return io_failure(io, "")
    return str(e) or type(e).__name__


def io_failure(io: OSError, path: str) -> str:
    """``PATH: No space left on device; free space there or choose another folder``: the path (``io``'s
    own file name; else the file being written where it failed, :func:`_open_file_of`; else ``path``),
    the cause and what to do, for an ``OSError`` of :func:`io_cause`."""
    where = io.filename or _open_file_of(io) or path or "?"
    return f"{where}: {os.strerror(io.errno)}; {_NEXT.get(io.errno, 'check that path')}"


def _open_file_of(e: BaseException) -> str | None:
    """The path of the open file a write or close failed on: an ``OSError`` from ``write``,
    ``flush`` or ``close`` carries no file name, but the file object is a local of the frame it was
    raised in or of a caller (the innermost one wins)."""
    import io

    tb, frames = e.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in list(frame.f_locals.values()):
            if isinstance(value, io.IOBase):
                name = getattr(value, "path", None) or getattr(value, "name", None)
                if isinstance(name, str) and name:
                    return name
    return None


def io_cause(e: BaseException) -> OSError | None:
    """The ``OSError`` with an errno of :data:`_NEXT` (no space, quota, file too large, read-only, no permission) that
    ``e`` is or was caused by (libraries such as ``torch.distributed.checkpoint`` wrap it), else ``None``."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        err = stack.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _NEXT:
            return err
        stack += [err.__cause__, err.__context__]
        for arg in getattr(err, "args", ()):  # wrappers that carry the failures as arguments
            if isinstance(arg, BaseException):
                stack.append(arg)
            elif isinstance(arg, dict):
                stack += [v for v in arg.values() if isinstance(v, BaseException)]
                stack += [v[0] for v in arg.values() if isinstance(v, tuple) and v and isinstance(v[0], BaseException)]
    return None


USAGE, RUNTIME, INTERRUPTED = 2, 1, 130  # exit statuses of every colaflow command line


def exit_status(e: BaseException) -> int:
    """The exit status a command line ends with after ``e``: 130 for Ctrl-C, 2 (:data:`USAGE`) for
    a usage or config error (``ValueError``, which ``colaflow.config.ConfigError`` is), 1
    (:data:`RUNTIME`) for everything else: missing or unreachable data (a 404), I/O, corrupt input."""
    if isinstance(e, KeyboardInterrupt):
        return INTERRUPTED
    return USAGE if isinstance(e, ValueError) else RUNTIME


def guard(main: Callable[[], int]) -> int:
    """Run ``main`` and return its exit status; a closed pipe (``| head``) ends quietly with 0, Ctrl-C
    with :data:`INTERRUPTED` (130) after ``interrupted`` on stderr, also when ``main`` fails with another
    error after a Ctrl-C (a library that caught the ``KeyboardInterrupt``). ``SystemExit`` (argparse's
    ``--help`` and usage errors) passes through. An I/O failure (an ``OSError``: no space, read-only,
    no permission, a time-out, a refused connection; or an error caused by one) ends in one
    ``error:`` line naming the path and the cause (:func:`explain`) and :data:`RUNTIME` (1). Every network read ``main`` makes gets the
    timeout of ``COLAFLOW_CACHE_TIMEOUT_S`` (:mod:`colaflow.network`) unless it sets its own."""
    from colaflow.network import set_network_timeout, timeout_from_environment
    set_network_timeout(timeout_from_environment())  # no network read waits forever, whichever command
    ctrl_c = []

    def on_sigint(signum, frame):
        ctrl_c.append(signum)
        signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as Python's own handler raises it

    # a library can catch the KeyboardInterrupt and fail later for it (torch's lazy import of sympy, cut
    # short, leaves it half made: AttributeError): any error after a Ctrl-C is the Ctrl-C
    watch = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if watch:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        return main()
    except BrokenPipeError:
        # stdout's reader went away: point stdout at /dev/null so the interpreter's final flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - expected I/O failures end in one line; others keep their traceback
        if ctrl_c:
            print("interrupted", file=sys.stderr)
            return INTERRUPTED
        if not (isinstance(e, (OSError, TimeoutError)) or io_cause(e) is not None):
            raise
        print(f"error: {explain(e)}", file=sys.stderr)
        return RUNTIME
    finally:
        if watch:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def run_cli(main: Callable[[], int]) -> None:
    """Run ``main`` through :func:`guard` and exit with its status (a ``__main__`` block's one line)."""
    sys.exit(guard(main))
