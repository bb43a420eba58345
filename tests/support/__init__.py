"""Test support: fault-injecting HTTP server, local engines, synthetic data, browser screenshots, oracles."""
