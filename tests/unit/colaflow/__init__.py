"""Tests of ``colaflow`` (the command line)."""
