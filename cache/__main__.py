"""Entry point of ``python -m cache`` (see ``cache.cli``)."""
import sys

from cache.cli import main

sys.exit(main())
