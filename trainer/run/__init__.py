"""One run's lifecycle around the loop: the run folder (resume, refuse, overwrite), the start line, anomalies."""
