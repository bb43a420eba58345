"""Packing chunks of documents into compact batches (numpy only)."""
