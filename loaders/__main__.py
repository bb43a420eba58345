"""Entry point of ``python -m loaders`` (see :mod:`loaders.tools.cli`)."""
from colaflow.errors import run_cli
from loaders.tools.cli import main

run_cli(main)
