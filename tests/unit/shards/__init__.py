"""Tests of ``shards``."""
