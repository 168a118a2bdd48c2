"""Fitting a batch of datasets with one compiled model: sampling, lanes, provenance, the fit files."""
