"""Tests of ``trainer``."""
