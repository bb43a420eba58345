"""Entry point of ``python -m cache`` (see ``cache.cli``)."""
from cache.cli import main
from shards.errors import run_cli

run_cli(main)
