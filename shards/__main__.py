"""Entry point of ``python -m shards`` (see :mod:`shards.tools.cli`)."""
from shards.tools.cli import main
from colaflow.errors import run_cli

run_cli(main)
