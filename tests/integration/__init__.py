"""Tests across stages: the demo path, preprocessing to training."""
