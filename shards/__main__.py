"""Entry point of ``python -m shards`` (see :mod:`shards.cli`)."""
from .cli import main
from .errors import run_cli

run_cli(main)
