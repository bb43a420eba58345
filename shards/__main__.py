"""Entry point of ``python -m shards`` (see :mod:`shards.tools.cli`)."""
from colaflow.errors import run_cli
from shards.tools.cli import main

run_cli(main)
