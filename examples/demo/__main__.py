"""Entry point of ``python -m examples.demo`` (``make demo``; see :mod:`examples.demo.run`)."""
from examples.demo.run import main

main()
