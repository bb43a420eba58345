"""Tests of one package each."""
