"""Simulation-based calibration (SBC) as a sweep: simulate, fit like any dataset, rank, test.

Talts et al. (2018): if parameters are drawn from the prior and data from the model given them,
the rank of each true value among the posterior draws of a fit to that data is uniform, for a
correct model and a correct sampler. batchfit makes each simulated dataset an ordinary dataset
file, so the fits go through the same compile cache, batches, provenance and cluster rules as a
sweep of real data:

* `simulate` draws N parameter sets and observed data from the prior predictive of the model
  (or of a separate simulator model file) built on a template dataset, with one compiled
  forward-sampling function; simulation i depends only on ``sbc.seed`` and i. Each becomes
  ``{results}/sbc/data/sim-NNNNN.{csv|nc}`` (the template with its observed columns replaced)
  and ``{results}/sbc/truth/sim-NNNNN.json`` (the true values). A simulation whose truth file
  records the current inputs' digest and its data file's sha256 is never rewritten, so raising
  ``n_simulations`` leaves the existing files, hence their fits, untouched.
* The template is coded as the sweep codes it (`template_levels`): a sweep-wide text column has
  every label of the sweep, those the template lacks included. Those levels are recorded in
  ``{results}/sbc/template_coding.json``, and the simulated sweep codes every simulated file by
  exactly them, in every process: left to find its own levels in the simulated files, it would
  see only the template's labels, and build another model than the simulator's.
* `sbc_config` is the user's config with those files as ``datasets``, ``{results}/sbc`` as
  ``results_dir`` and the recorded levels as ``columns``: `batchfit.sweep.plan.plan` and
  `batchfit.fitting.batch.fit_batch` fit only what is pending, so a killed run resumes and more
  simulations fit only the new ones.
* `rank_simulations` ranks each true value among the thinned posterior draws for every scalar
  element of every free parameter and deterministic, tests uniformity with ArviZ's simultaneous
  ECDF bands (Säilynoja, Bürkner & Vehtari 2022) and writes ``ranks.csv``, ``ranks.nc``,
  ``uniformity.csv``, ``verdict.txt`` and one PNG per parameter. Simulations whose fit failed
  are counted in the verdict, never silently dropped: leaving them out biases SBC.
"""
