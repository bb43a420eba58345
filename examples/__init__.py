"""Examples and the demo; not part of the installed product."""
