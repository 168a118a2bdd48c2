"""ArviZ's convergence diagnostics (ess bulk and tail, rank r_hat, mcse of mean and sd) for many
elements at once (its E-BFMI of each chain, which a fit job scores too: `batchfit.fitting.sampler_health.bfmi`).

arviz_stats computes these one element at a time: its ``make_ufunc`` loops over elements in Python
(https://github.com/arviz-devs/arviz/issues/2090), which was most of collect's time on many small
fits. Here each statistic is one NumPy pass over an (element, chain,
draw) array, following arviz_stats' definitions step by step (``arviz_stats.base.diagnostics``,
1.x; Vehtari et al. 2021, https://doi.org/10.1214/20-BA1221), so the values are arviz_stats' own to
rounding: tests/unit/test_diagnostics.py compares every function with arviz_stats on many posteriors,
edge cases included.
"""

from __future__ import annotations

import functools
import statistics

import numpy as np

MIN_DRAWS = 4  # fewer draws per chain: NaN, as arviz_stats' `not_valid`


def ess_bulk(draws: np.ndarray) -> np.ndarray:
    """Bulk ESS of each element of ``draws`` shaped (element, chain, draw): ESS of the rank-normalised split chains."""
    return _masked(draws, 1, lambda x: _ess(_z_scale(_split_chains(x))))


def ess_tail(draws: np.ndarray, prob: float) -> np.ndarray:
    """Tail ESS: the smaller ESS of the indicators of falling below the ``(1 - prob) / 2`` and ``(1 + prob) / 2``
    quantiles, as arviz_stats' ``ess(method="tail", prob=prob)``."""
    def tail(x: np.ndarray) -> np.ndarray:
        low, high = sorted((prob, 1 - prob))
        low_ess, high_ess = _ess_quantile(x, low), _ess_quantile(x, high)
        return np.where(high_ess < low_ess, high_ess, low_ess)  # Python's min(low, high), NaN included
    return _masked(draws, 1, tail)


def rhat(draws: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat: the larger of the bulk and the folded (tail) one; NaN with one chain."""
    def rank(x: np.ndarray) -> np.ndarray:
        split = _split_chains(x)
        bulk = _rhat(_z_scale(split))
        tail = _rhat(_z_scale(np.abs(split - np.median(split, axis=(1, 2), keepdims=True))))
        return np.where(tail > bulk, tail, bulk)  # Python's max(bulk, tail), NaN included
    return _masked(draws, 2, rank)


def mcse_mean(draws: np.ndarray) -> np.ndarray:
    """Monte Carlo standard error of the mean: sd / sqrt(ESS of the split chains)."""
    def mcse(x: np.ndarray) -> np.ndarray:
        return _flat(x).std(axis=-1, ddof=1) / np.sqrt(_ess(_split_chains(x)))
    return _masked(draws, 1, mcse)


def mcse_sd(draws: np.ndarray) -> np.ndarray:
    """Monte Carlo standard error of the sd, from the ESS of the squared deviations (arviz_stats' ``_mcse_sd``)."""
    def mcse(x: np.ndarray) -> np.ndarray:
        centred = x - _flat(x).mean(axis=-1)[:, None, None]
        squared = centred**2
        ess = _ess(_split_chains(squared))
        evar = _flat(squared).mean(axis=-1)
        varvar = (_flat(centred**4).mean(axis=-1) - evar**2) / ess
        return np.sqrt(varvar / evar / 4)
    return _masked(draws, 1, mcse)


def _masked(draws: np.ndarray, min_chains: int, statistic) -> np.ndarray:
    """`statistic` of every element, NaN where arviz_stats returns NaN without computing: any NaN
    draw, fewer than ``min_chains`` chains or `MIN_DRAWS` draws."""
    draws = np.asarray(draws, dtype=float)
    n_elements, n_chains, n_draws = draws.shape
    out = np.full(n_elements, np.nan)
    valid = ~np.isnan(draws).any(axis=(1, 2))
    if n_chains < min_chains or n_draws < MIN_DRAWS or not valid.any():
        return out
    with np.errstate(divide="ignore", invalid="ignore"):  # constant elements divide 0 by 0, as in arviz_stats
        out[valid] = statistic(draws[valid])
    return out


def _flat(x: np.ndarray) -> np.ndarray:
    """(element, chain * draw): one row per element, reduced as arviz_stats reduces a whole (chain, draw) array."""
    return x.reshape(x.shape[0], -1)


def _split_chains(x: np.ndarray) -> np.ndarray:
    """Each chain's first and last halves as two chains (first halves first; a middle draw dropped)."""
    half = x.shape[2] // 2
    return np.concatenate((x[:, :, :half], x[:, :, x.shape[2] - half:]), axis=1)


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Normal scores of each element's ranks over all its draws (average ranks for ties; Blom's offset 3/8)."""
    ranks = _average_ranks(_flat(x))
    scores = np.full(ranks.shape, np.nan)
    valid = ~np.isnan(ranks)
    scores[valid] = _normal_scores(x.shape[1] * x.shape[2])[(2 * ranks[valid]).astype(np.intp) - 2]
    return scores.reshape(x.shape)


@functools.lru_cache(maxsize=8)
def _normal_scores(size: int) -> np.ndarray:
    """The normal score of each possible average rank among `size` draws: 1, 1.5, 2, ..., size.

    Average ranks are whole or half numbers, so one table of ``2 * size - 1`` normal quantiles
    serves every row of every fit of that size, from `statistics.NormalDist.inv_cdf` (Wichura's
    AS241, as precise as the ``scipy.special.ndtri`` arviz_stats uses, to ~1 ulp) rather than
    importing scipy.special, a noticeable part of every collect process's start.
    """
    inv_cdf = statistics.NormalDist().inv_cdf
    ranks = np.arange(2, 2 * size + 1) / 2
    scores = np.array([inv_cdf(p) for p in (ranks - 3 / 8) / (size - 2 * 3 / 8 + 1)])
    scores.flags.writeable = False  # shared by every caller
    return scores


def _next_5_smooth(n: int) -> int:
    """The least length >= n without a prime factor above 5: what arviz_stats pads its FFTs to
    (``scipy.fftpack.next_fast_len``; scipy.fft's differs), without importing scipy."""
    best = None
    power5 = 1
    while True:
        power35 = power5
        while True:
            length = power35
            while length < n:
                length *= 2
            best = length if best is None else min(best, length)
            if power35 >= n:
                break
            power35 *= 3
        if power5 >= n:
            return best
        power5 *= 5


def _average_ranks(rows: np.ndarray) -> np.ndarray:
    """Ranks 1..n within each row, ties sharing their average rank, a row with a NaN all NaN (an infinite
    draw's folded value is): ``scipy.stats.rankdata(method="average")`` without importing scipy.stats
    (a noticeable part of every collect and plots job; see `batchfit.outputs.intervals`)."""
    n = rows.shape[-1]
    order = np.argsort(rows, axis=-1, kind="stable")
    ordered = np.take_along_axis(rows, order, axis=-1)
    position = np.broadcast_to(np.arange(n), rows.shape)
    starts = np.ones(rows.shape, dtype=bool)  # each tie group's first sorted position ...
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ends = np.ones(rows.shape, dtype=bool)  # ... and its last
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, position, 0), axis=-1)
    last = np.minimum.accumulate(np.where(ends, position, n - 1)[:, ::-1], axis=-1)[:, ::-1]
    ranks = np.empty(rows.shape)
    np.put_along_axis(ranks, order, (first + last) / 2 + 1, axis=-1)
    ranks[np.isnan(rows).any(axis=-1)] = np.nan
    return ranks


def _ess_quantile(x: np.ndarray, prob: float) -> np.ndarray:
    """ESS of the indicator of a draw falling at or below the element's ``prob`` quantile."""
    quantile = np.quantile(_flat(x), prob, axis=-1)
    return _ess(_split_chains((x <= quantile[:, None, None]).astype(float)))


def _rhat(x: np.ndarray) -> np.ndarray:
    """Potential scale reduction of (element, chain, draw) chains."""
    n_draws = x.shape[2]
    between = n_draws * np.var(x.mean(axis=2), axis=1, ddof=1)
    within = np.var(x, axis=2, ddof=1).mean(axis=1)
    return np.sqrt((between / within + n_draws - 1) / n_draws)


def _ess(x: np.ndarray) -> np.ndarray:
    """Effective sample size of (element, chain, draw) chains: Geyer's initial monotone sequence
    estimator over the autocorrelations averaged across chains.

    arviz_stats walks the sequence in a loop per element; the same rules over all elements:
    the pairs (rho[2k], rho[2k+1]) are summed while the previous pair's sum is positive (at
    most to lag n - 3); these pairs are made non-increasing (each pair capped at the one before
    it, a running minimum); tau = -1 + 2 * (their sum) + rho at the lag after them if that
    is positive (or belongs to a pair whose sum is not negative).
    """
    n_elements, n_chains, n_draws = x.shape
    size = n_chains * n_draws
    centred = x - x.mean(axis=2, keepdims=True)
    m = _next_5_smooth(2 * n_draws)
    spectrum = np.fft.rfft(centred, n=m, axis=2)
    spectrum *= np.conjugate(spectrum)
    acov = np.fft.irfft(spectrum, n=m, axis=2)[:, :, :n_draws] / n_draws
    # averaged over chains with the chain axis last and contiguous: summed in arviz_stats' order
    mean_acov = np.ascontiguousarray(acov.transpose(0, 2, 1)).mean(axis=-1)
    mean_var = mean_acov[:, 0] * n_draws / (n_draws - 1.0)
    var_plus = mean_var * (n_draws - 1.0) / n_draws
    if n_chains > 1:
        var_plus = var_plus + np.var(x.mean(axis=2), axis=1, ddof=1)
    rho = 1.0 - (mean_var[:, None] - mean_acov) / var_plus[:, None]
    rho[:, 0] = 1.0

    n_pairs = max((n_draws - 3) // 2, 0)  # the last pair arviz_stats' loop may reach (lag < n - 3)
    rows = np.arange(n_elements)
    pair_sums = rho[:, 0:2 * n_pairs + 1:2] + rho[:, 1:2 * n_pairs + 2:2]  # pairs 0..n_pairs
    stops = ~(pair_sums > 0)  # a non-positive (or NaN) pair ends the sequence
    last = np.where(stops.any(axis=1), stops.argmax(axis=1), n_pairs)  # the pair the loop computed last
    kept = np.arange(pair_sums.shape[1])[None, :] < last[:, None]
    monotone = np.minimum.accumulate(np.where(kept, pair_sums, np.inf), axis=1)
    tau = -1.0 + 2.0 * np.where(kept, monotone, 0.0).sum(axis=1)
    after = rho[rows, 2 * last]
    last_counts = (after > 0) | ((last >= 1) & (pair_sums[rows, last] >= 0))
    tau += np.where(last_counts, after, 0.0)
    tau = np.maximum(tau, 1 / np.log10(size))
    ess = size / tau
    ess[np.isnan(rho[:, 1])] = np.nan
    constant = (x.max(axis=(1, 2)) - x.min(axis=(1, 2))) < np.finfo(float).resolution
    return np.where(constant, float(size), ess)
