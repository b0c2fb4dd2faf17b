"""Sub-commands of `dyncomplete`, one module each."""
