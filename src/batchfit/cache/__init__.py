"""The compiled-function cache directory: entries, their one get-or-build path, healing and upkeep."""
