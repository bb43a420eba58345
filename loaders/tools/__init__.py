"""Loader tools: the ``loaders`` command line (``keys``, ``bench``)."""
