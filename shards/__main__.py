"""Entry point of ``python -m shards`` (see :mod:`shards.cli`)."""
from .cli import main

raise SystemExit(main())
