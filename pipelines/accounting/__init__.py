"""Record accounting: events and ``stats.json``, the read summary, and the end-of-job report."""
