"""``python -m colaflow``: the ``colaflow`` command (see :mod:`colaflow.cli`)."""
import sys

from colaflow.cli import main

sys.exit(main())  # main guards Ctrl-C and a closed pipe itself: it is also the console script
