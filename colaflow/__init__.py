"""colaflow's own small package: the one command line (``colaflow <command>``), the config system, exit codes and error wording."""
