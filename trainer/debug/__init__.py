"""Debugging a run after the fact: replay a bad step and name the first module that went wrong."""
