"""Issue 37: an expected I/O failure (no space, read-only, no permission), also wrapped inside a
library's own error, is one line naming the path and the cause, with what to do."""
from __future__ import annotations

import errno

import pytest

from colaflow.errors import INTERRUPTED, RUNTIME, explain, guard, io_cause


def test_a_wrapped_no_space_error_is_found_and_named():
    inner = OSError(errno.ENOSPC, "No space left on device", "/data/ckpt/__0_0.distcp")
    try:
        try:
            raise inner
        except OSError:
            raise RuntimeError("unexpected pos 704 vs 598")  # what torch.save says, the OSError its context
    except RuntimeError as e:
        wrapped = ValueError("write", {0: (e, [])})  # how torch.distributed.checkpoint carries rank failures
    assert io_cause(wrapped) is inner
    assert explain(wrapped) == ("/data/ckpt/__0_0.distcp: No space left on device; free space there or choose "
                                "another folder")
    assert io_cause(RuntimeError("unexpected pos 704 vs 598")) is None


def test_every_command_line_ends_an_io_failure_in_one_line(capsys):
    def main():
        raise PermissionError(errno.EACCES, "Permission denied", "/readonly/out")
    assert guard(main) == RUNTIME
    assert capsys.readouterr().err == ("error: /readonly/out: Permission denied; check its permissions or choose "
                                       "another folder\n")
    with pytest.raises(KeyError):  # a bug keeps its traceback
        guard(lambda: {}["x"])


def test_a_failed_write_names_the_file_it_was_writing(capsys):
    """A write or close that fails for lack of space raises an OSError with no file name (``?`` was
    all the line said); the file being written is named."""
    def main():
        with open("/dev/full", "w") as f:  # every write here fails with ENOSPC, as on a full disk
            f.write("x")
        return 0
    assert guard(main) == RUNTIME
    assert capsys.readouterr().err == "error: /dev/full: No space left on device; free space there or choose another folder\n"


def test_a_storage_error_of_colaflow_keeps_its_own_line():
    """An error raised with its own one-line message from an I/O failure (a checkpoint save's
    ``checkpoint.dir=...: saving step 2 failed: ...``) is said as it is, not replaced by its cause."""
    from trainer.checkpointing.layout import CheckpointStorageError
    try:
        try:
            with open("/dev/full", "w") as f:
                f.write("x")
        except OSError as e:
            raise CheckpointStorageError("checkpoint.dir=/ck: saving step 2 failed: /ck/.step_2.partial: No space "
                                         "left on device; free space there or choose another folder") from e
    except CheckpointStorageError as e:
        assert explain(e) == str(e)


def test_ctrl_c_that_a_library_swallows_still_ends_as_interrupted(capsys):
    """Found by hand: Ctrl-C about 3 s into ``python -m trainer`` landed in torch's lazy import of sympy,
    which caught the KeyboardInterrupt, left the module half made, and the run ended in a traceback
    (``module 'sympy' has no attribute 'printing'``, exit 1) instead of ``interrupted`` and 130."""
    import os
    import signal

    def main():
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered by the handler guard runs under
            for _ in range(1000):
                pass
        except KeyboardInterrupt:
            pass  # swallowed, as the half-finished import did
        raise AttributeError("module 'sympy' has no attribute 'printing'")
    assert guard(main) == INTERRUPTED
    assert capsys.readouterr().err.strip() == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # guard leaves Ctrl-C as it found it
    with pytest.raises(AttributeError):  # without a Ctrl-C, an unexpected error keeps its traceback
        guard(lambda: (_ for _ in ()).throw(AttributeError("no Ctrl-C here")))
