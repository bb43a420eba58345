"""colaflow's test suite."""
