"""Entry point of ``python -m cache`` (see ``cache.tools.cli``)."""
from cache.tools.cli import main
from colaflow.errors import run_cli

run_cli(main)
