"""Tests of the code base itself: import cycles, docstrings, command lines, worker dependencies."""
