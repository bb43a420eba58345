"""The suite's transformers log handler survives the close of the stream it was made with (a
``capsys`` stream of an earlier test): CI once failed on ``--- Logging error ---`` in the captured
stderr of a test that expected one ``error:`` line."""
from __future__ import annotations

import io

from tests.support.hf import relink_logs


def test_a_handler_made_on_a_closed_stream_writes_to_the_live_one(capsys):
    from transformers.utils import logging as hf_logging
    hf_logging.get_logger("transformers")
    handler = hf_logging._default_handler
    kept = handler.stream, handler.flush
    dead = io.StringIO()
    handler.stream, handler.flush = dead, dead.flush  # as transformers binds a stream when it makes the handler
    dead.close()
    try:
        relink_logs()
        hf_logging.get_logger("transformers.colaflow_test").warning("still heard")
        err = capsys.readouterr().err
    finally:
        handler.stream, handler.flush = kept
    assert "Logging error" not in err and "[transformers] still heard" in err
