"""Tests of ``loaders``."""
