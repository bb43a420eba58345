"""A run around the loop: its command line, run folder (resume, refuse, overwrite), start line, bad-step
guard, step hooks and event log.
"""
