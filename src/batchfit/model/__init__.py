"""The user's model file: loading it, calling its ``build_model``, the code it imports, its variables."""
