"""Tests of ``cache``."""
