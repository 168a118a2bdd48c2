"""A sweep's outputs: collect's posteriors.nc, summary.csv and failures.csv, diagnostics, plots, report pages."""
