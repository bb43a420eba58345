"""Shard tools: verification against the format and the manifest, resharding, and the ``shards`` command line."""
