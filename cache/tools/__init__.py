"""Cache tools: the ``cache`` command line, node tuning and a Range-capable file server."""
