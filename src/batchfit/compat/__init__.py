"""Every use of another library's private API, in one place: a module per library.

batchfit reaches below the public APIs of PyMC where no public one gives what it needs. Each
use names the upstream code and the version it was written against; ``tests/unit/test_compat.py``
fails with the API's name when an upgrade removes or changes one.
"""
