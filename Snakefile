# batchfit: fit one PyMC model to many datasets.
#   snakemake --cores 2                              # the bundled example (config/config.yaml)
#   snakemake --cores 2 --configfile config/nes.yaml # another sweep
# The rules only wire files together; every stage is a batchfit library function (see scripts/).
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/compile.smk"
include: "workflow/rules/fit.smk"
include: "workflow/rules/collect.smk"


rule all:
    input:
        rules.collect.output,
        rules.status.output,
    default_target: True
