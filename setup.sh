#!/usr/bin/env bash
# Set up batchfit in .venv (Python 3.12) and run the bundled example sweep.
#   ./setup.sh            install, then `snakemake --cores 2` on the bundled example
#   ./setup.sh --install  install only
#   ./setup.sh --slurm    also install Snakemake's SLURM executor plugin (the `slurm` extra), for a
#                         cluster and for tests/e2e/test_slurm.py (CI runs `./setup.sh --install --slurm`)
# The plugin is not installed unless asked: Snakemake imports every installed executor plugin at
# start-up, and this one then runs `scontrol show config`, which waits out SLURM's connection
# timeout where SLURM's client tools are installed but no controller answers
# (docs/troubleshooting.md, "Slow jobs").
# Also builds the two venvs the test suite runs programs in (tests/testkit/venvs.py): .venv-user, batchfit as a
# user installs it (no extras), where the end-to-end sweeps run, and .venv-reference, with JAX, for the
# parity corpus's reference side. The tests build a missing one themselves, inside their time.
set -euo pipefail
cd "$(dirname "$0")"

install_only=0
extras="test,bench"
for arg in "$@"; do
  case "$arg" in
    --install) install_only=1 ;;
    --slurm) extras="$extras,slurm" ;;
    *) echo "setup.sh: unknown option $arg (known: --install, --slurm)" >&2; exit 2 ;;
  esac
done

find_python() {
  # python3.12 on PATH may be a pyenv shim that refuses to run; check each candidate works.
  local candidates=(python3.12)
  if command -v pyenv >/dev/null 2>&1; then
    candidates+=("$(pyenv root)"/versions/3.12*/bin/python3.12)
  fi
  candidates+=(/usr/bin/python3.12 /usr/local/bin/python3.12 python3)
  for py in "${candidates[@]}"; do
    if "$py" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))' >/dev/null 2>&1; then
      echo "$py"; return 0
    fi
  done
  echo "setup.sh: no Python >= 3.12 found (PyMC 6 needs it); install python3.12" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[$extras]"
PYTHONPATH=tests .venv/bin/python -m testkit.venvs

if [ "$install_only" = 0 ]; then
  .venv/bin/snakemake --cores 2
  echo "Example sweep done: results/example/summary.csv, results/example/posteriors.nc"
fi
