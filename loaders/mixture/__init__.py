"""Weighted mixtures of datasets: the draw, the sources and their resume state (numpy only)."""
