"""How every colaflow command line reports a failure: one line saying what is wrong, no traceback."""
from __future__ import annotations

import os
import sys
from typing import Callable


def explain(e: BaseException) -> str:
    """One-line description of ``e`` for a user.

    fsspec reports a missing *or unreachable* URL as ``FileNotFoundError(url)``, with the network
    error as its cause; the cause is named so "404" and "nothing listens on that port" differ.
    """
    if isinstance(e, FileNotFoundError):
        what = e.filename or (e.args[0] if e.args else "")
        cause = e.__cause__ or e.__context__
        reason = f" ({type(cause).__name__}: {cause})" if cause else ""
        return f"not found or unreachable: {what}{reason}; check the path or URL and that its server is running"
    return str(e) or type(e).__name__


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
    with :data:`INTERRUPTED` (130) after ``interrupted`` on stderr. ``SystemExit`` (argparse's
    ``--help`` and usage errors) passes through."""
    try:
        return main()
    except BrokenPipeError:
        # stdout's reader went away: point stdout at /dev/null so the interpreter's final flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


def run_cli(main: Callable[[], int]) -> None:
    """Run ``main`` through :func:`guard` and exit with its status (a ``__main__`` block's one line)."""
    sys.exit(guard(main))
