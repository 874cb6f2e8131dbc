"""Pure functions over numpy arrays and Arrow tables: no torch, gin, files or logging."""
