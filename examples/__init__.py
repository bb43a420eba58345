"""Examples and the demo; not part of the installed product: ``make demo`` (``examples/demo/``), and
colaflow's loader in other frameworks' loops (``docs/frameworks.md``): ``plain_loop``, ``hf_trainer``,
``lightning_fit``, ``titan_loop``."""
import sys
from typing import Callable


def run(main: Callable[[], object]) -> None:
    """Run an example's ``main``: a bad ``--shards`` or setting ends in one line on stderr, no traceback
    (exit 2 for a bad setting, 1 for missing data; :func:`colaflow.errors.exit_status`)."""
    from colaflow.errors import exit_status, explain
    try:
        main()
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        sys.exit(exit_status(e))
