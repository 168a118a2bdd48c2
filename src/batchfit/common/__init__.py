"""Small tools every stage uses: atomic file writes, content hashes, helper processes, quick exits."""
