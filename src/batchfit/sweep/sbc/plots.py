"""SBC's plots: the ECDF of each parameter's ranks within its simultaneous band."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import xarray as xr

from batchfit.common.atomic import atomic_path
from batchfit.sweep.sbc.pit import Ranked, element_prob, pit_values, simultaneous_band
from batchfit.sweep.sbc.sweep import RANKS_GROUP

log = logging.getLogger("batchfit")


def plot_ranks(ranks: Mapping[str, Ranked], n_draws: int, envelope_prob: float, n_elements: int,
               out_dir: Path) -> list[Path]:
    """One PNG per parameter (a panel per element): arviz_plots' ECDF-difference plot of the ranks,
    with the simultaneous band the verdict uses drawn over it.

    arviz_plots draws a band itself only with its ``method="envelope"``, which fails in
    arviz-plots 1.3 (``np.linspace`` given a DataArray); its default ``pot_c`` plot marks the
    ranks that depart most from uniformity and prints the test's p-value. The band depends only
    on the number of simulations and the probability, so it is the same in every panel.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window in a job
    import matplotlib.pyplot as plt
    from arviz_plots import plot_ecdf_pit

    paths = []
    prob = element_prob(envelope_prob, n_elements)
    for name, ranked in ranks.items():
        pit = pit_values(ranked.values, n_draws)
        x, lower, upper = simultaneous_band(len(pit), prob)
        ds = xr.Dataset({name: (("chain", "draw", *ranked.dims), pit[None])}, coords=dict(ranked.coords))
        pc = plot_ecdf_pit(xr.DataTree.from_dict({RANKS_GROUP: ds}), group=RANKS_GROUP, backend="matplotlib")
        figure = pc.get_viz("figure")
        for ax in figure.axes:
            if ax.lines:
                ax.fill_between(x, lower - x, upper - x, step="post", alpha=0.2, color="grey",
                                label=f"{prob:.3g} simultaneous band")
        figure.suptitle(f"{name}: ECDF of ranks minus uniform, {len(pit)} simulations", y=1.02)
        path = out_dir / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format="png", dpi=90, bbox_inches="tight")
        plt.close(figure)
        paths.append(path)
    return paths
