"""Tests of ``pipelines``."""
