"""batchfit: fit one PyMC model structure to many datasets, compiling once."""

__version__ = "0.1.0"
