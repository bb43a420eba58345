"""Offline run reports: read a run's metrics and events, draw its plots, render HTML and the Grafana dashboard."""
