"""batchfit.outputs.diagnostics and batchfit.outputs.intervals against arviz_stats' own functions on the same draws:
every statistic collect writes, on chains of every shape and autocorrelation and on the edge cases
arviz_stats treats specially (constant, tied, binary, NaN and infinite draws, too few chains or draws)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from arviz_stats.base import array_stats
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from batchfit.fitting import sampler_health
from batchfit.outputs import diagnostics, intervals

PROB = 0.89


def both(draws: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each statistic by batchfit (vectorised) and by arviz_stats (an element at a time); intervals at
    ArviZ's default probability, at 50% (the forest plots' inner one) and at 1."""
    flat = draws.reshape(draws.shape[0], -1)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # arviz_stats' own warnings for constant or invalid draws
        return {
            **{f"{kind} {prob}": (getattr(intervals, kind)(flat, prob), getattr(array_stats, kind)(flat, prob))
               for kind in ("hdi", "eti") for prob in (PROB, 0.5, 1.0)},
            "ess_bulk": (diagnostics.ess_bulk(draws), array_stats.ess(draws, method="bulk")),
            "ess_tail": (diagnostics.ess_tail(draws, PROB), array_stats.ess(draws, method="tail", prob=PROB)),
            "r_hat": (diagnostics.rhat(draws), array_stats.rhat(draws)),
            "mcse_mean": (diagnostics.mcse_mean(draws), array_stats.mcse(draws, method="mean")),
            "mcse_sd": (diagnostics.mcse_sd(draws), array_stats.mcse(draws, method="sd")),
        }


def assert_equal_to_arviz(draws: np.ndarray) -> None:
    for name, (ours, reference) in both(draws).items():
        assert ours.shape == reference.shape and ours.shape[0] == draws.shape[0], name
        np.testing.assert_allclose(ours, reference, rtol=1e-12, atol=0, equal_nan=True,
                                   err_msg=f"{name} on draws shaped {draws.shape}")


def ar1(rng: np.random.Generator, shape: tuple[int, ...], phi: float) -> np.ndarray:
    """AR(1) chains along the last axis: autocorrelation `phi` (negative, none, high or near 1)."""
    noise = rng.normal(size=shape)
    x = np.empty(shape)
    x[..., 0] = noise[..., 0]
    for i in range(1, shape[-1]):
        x[..., i] = phi * x[..., i - 1] + noise[..., i]
    return x


@pytest.mark.parametrize("chains", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("draws", [3, 4, 5, 8, 9, 10, 101, 1000])
def test_diagnostics_equal_arviz_stats_on_chains_of_every_shape(chains: int, draws: int) -> None:
    """Elements from anticorrelated to nearly stuck (the Geyer sequence then runs to its lag bound)."""
    rng = np.random.default_rng(chains * 1000 + draws)
    elements = [ar1(rng, (2, chains, draws), phi) for phi in (-0.6, 0.0, 0.5, 0.95, 0.9995)]
    assert_equal_to_arviz(np.concatenate(elements))


def test_diagnostics_equal_arviz_stats_on_its_edge_cases() -> None:
    rng = np.random.default_rng(3)
    x = ar1(rng, (10, 4, 200), 0.3)
    x[0] = 1.5                                     # constant: ess is the draw count, r_hat NaN
    x[1, 0] = 5.0                                  # one chain constant
    x[2] = np.round(x[2])                          # ties
    x[3] = rng.integers(0, 2, size=(4, 200))       # binary
    x[4, 2] += 10.0                                # one chain elsewhere: r_hat well above 1
    x[5, 1, 7] = np.nan                            # one NaN draw: NaN everywhere
    x[6] = np.nan                                  # all NaN
    x[7, 0, 0] = np.inf                            # one infinite draw
    x[8] = rng.standard_cauchy(size=(4, 200)) * 1e8  # heavy tails, large scale
    x[9] *= 1e-12                                  # tiny scale, not constant
    assert_equal_to_arviz(x)
    assert np.isnan(both(x)["r_hat"][0][[0, 5, 6]]).all()  # the cases above do what they say
    assert both(x)["ess_bulk"][0][0] == 800 and both(x)["r_hat"][0][4] > 1.5


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 40)),
              elements=st.floats(-1e6, 1e6) | st.sampled_from([0.0, 1.0, np.nan, np.inf, -np.inf])))
def test_diagnostics_equal_arviz_stats_on_any_draws(draws: np.ndarray) -> None:
    assert_equal_to_arviz(draws)


@pytest.mark.parametrize("prob", [0.01, 0.5, 0.89, 0.94, 1.0])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_intervals_equal_arviz_stats_on_integer_and_tied_samples(prob: float, n: int) -> None:
    """Discrete variables' integer draws (intervals of floats, as arviz_stats gives), ties, any sample count."""
    rng = np.random.default_rng(n)
    for rows in (rng.integers(0, 4, size=(5, n)), np.round(rng.normal(size=(5, n)), 1)):
        for kind in ("hdi", "eti"):
            ours, reference = getattr(intervals, kind)(rows, prob), getattr(array_stats, kind)(rows, prob)
            np.testing.assert_array_equal(ours, reference, err_msg=f"{kind} {prob} on {rows.dtype} rows of {n}")
            assert ours.dtype == reference.dtype == np.float64
    with pytest.raises(ValueError, match="prob"):
        intervals.hdi(rows, 0.0)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 30)),
              elements=st.sampled_from([0.0, 1.0, -2.5, np.nan, np.inf, -np.inf]) | st.floats(-10, 10)))
def test_average_ranks_equal_scipy_rankdata(rows: np.ndarray) -> None:
    from scipy import stats

    np.testing.assert_array_equal(diagnostics._average_ranks(rows), stats.rankdata(rows, method="average", axis=-1))


@pytest.mark.parametrize("size", [4, 7, 400, 4001, 20_000])
def test_normal_scores_equal_scipy_ndtri(size: int) -> None:
    """The table of normal scores by half rank equals what arviz_stats computes (``scipy.special.ndtri``)
    at every rank a row of `size` draws can have, to a few ulp."""
    from scipy import special

    ranks = np.arange(2, 2 * size + 1) / 2
    reference = special.ndtri((ranks - 3 / 8) / (size - 2 * 3 / 8 + 1))
    np.testing.assert_allclose(diagnostics._normal_scores(size), reference, rtol=4e-15, atol=4e-15)


def test_fft_lengths_equal_scipy_fftpack() -> None:
    from scipy.fftpack import next_fast_len

    for n in [*range(1, 5_000), 10**6 + 1, 3 * 10**7 + 7]:
        assert diagnostics._next_5_smooth(n) == next_fast_len(n), n


@pytest.mark.parametrize("kind", [None, "hdi", "eti"])
def test_summary_of_default_settings_is_arviz_stats_summary_with_its_defaults(kind: str | None) -> None:
    """summary.ci_kind and ci_prob left unset follow ArviZ's rcParams (issue #45: summary.csv had hdi89
    while arviz_stats.summary gives eti89): the columns and values of `arviz_stats.summary` called as a user
    calls it, also with rcParams["stats.ci_kind"] changed."""
    import arviz_stats
    from arviz_base import from_dict, rc_context

    from batchfit.outputs.summary_cache import summarise_posterior
    from batchfit.settings import SummarySettings

    rng = np.random.default_rng(45)
    tree = from_dict({"posterior": {"mu": rng.normal(size=(2, 200)), "a": rng.normal(size=(2, 200, 3))}})
    with rc_context(rc={"stats.ci_kind": kind} if kind else {}):
        reference = arviz_stats.summary(tree, round_to="none")
        ours = summarise_posterior(tree["posterior"].to_dataset(), "d", "d.nc", SummarySettings())
    assert list(ours.columns[:-1]) == list(reference.columns)
    np.testing.assert_allclose(ours.loc[reference.index, reference.columns].to_numpy(float),
                               reference.to_numpy(float), rtol=1e-10)


@pytest.mark.parametrize("chains", [1, 2, 4])
@pytest.mark.parametrize("draws", [2, 3, 10, 1000])
def test_bfmi_equals_arviz_stats_per_chain(chains: int, draws: int) -> None:
    """E-BFMI of each chain's energy, from one that barely moves between draws (low) to one that
    anticorrelates (above 1), and a constant chain (NaN, as arviz_stats gives)."""
    rng = np.random.default_rng(chains * 100 + draws)
    for phi in (-0.6, 0.0, 0.9, 0.9995):
        energy = ar1(rng, (chains, draws), phi) + 50.0
        np.testing.assert_allclose(sampler_health.bfmi(energy), array_stats.bfmi(energy), rtol=1e-12, atol=0,
                                   err_msg=f"phi {phi}")
    constant = np.full((chains, draws), 3.0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(sampler_health.bfmi(constant), array_stats.bfmi(constant))
    assert np.isnan(sampler_health.bfmi(constant)).all()
