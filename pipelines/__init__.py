"""Beam preprocessing: raw JSONL/text/Parquet → cleaned, deduplicated, tokenised WebDataset shards.

Entry points: ``python beam_runner.py`` (command line), :func:`pipelines.job.run` (in-process),
``python -m examples.demo.corpus`` (the Shakespeare + KJV demo corpus). See ``docs/preprocessing.md``
and ``docs/cluster.md``.
"""
