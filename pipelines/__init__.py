"""Beam preprocessing: raw JSONL/text/Parquet → cleaned, deduplicated, tokenised WebDataset shards.

Entry points: ``python beam_runner.py`` (command line), :func:`pipelines.job.run` (in-process),
``python -m examples.demo.corpus`` (the Shakespeare + KJV demo corpus). The job graph and the
folder map: ``pipelines/README.md``; the stages: ``docs/preprocessing.md``; runners: ``docs/cluster.md``.
"""
