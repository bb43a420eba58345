"""Entry point of ``python -m examples.demo`` (``make demo``; see :mod:`examples.demo.run`)."""
from colaflow.errors import run_cli
from examples.demo.run import main

run_cli(main)
