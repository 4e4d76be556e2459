"""Monte Carlo sensitivities on dask.distributed: a European call's price and its pathwise
derivatives (delta by the spot, vega by the volatility, rho by the rate) over a million
simulated end prices, split into shards that 2 worker processes of a ``LocalCluster``
evaluate. The payoff's sum over one shard is recorded once (``ad.record`` of tensor
code); its value and gradient are computed on every shard where the shard lives (the
recording sent to each worker once, as its program) and summed by a tree. The estimates
must agree with Black and Scholes' closed forms within 4 standard errors of the
simulation, and with the same shards summed in one process to 1e-12. docs/distributed.md.

    python examples/monte_carlo.py [--paths 1000000] [--shards 20] [--workers 2]
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

import easyad as ad

STRIKE, MATURITY = 100.0, 1.0
MARKET = np.array([105.0, 0.2, 0.03])          # spot, volatility, rate


def discounted_payoffs(m, z):
    """exp(-rT) max(S_T - K, 0) summed over the normal draws z, S_T from geometric
    Brownian motion: m = (spot, volatility, rate)."""
    spot, vol, rate = m[0], m[1], m[2]
    end = spot * ad.exp((rate - 0.5 * vol * vol) * MATURITY + vol * math.sqrt(MATURITY) * z)
    return ad.sum(ad.nn.functional.relu(end - STRIKE)) * ad.exp(-rate * MATURITY)


def black_scholes(spot: float, vol: float, rate: float) -> tuple[float, np.ndarray]:
    """The call's price and (delta, vega, rho) in closed form."""
    from scipy.stats import norm
    d1 = (math.log(spot / STRIKE) + (rate + 0.5 * vol ** 2) * MATURITY) / \
        (vol * math.sqrt(MATURITY))
    d2 = d1 - vol * math.sqrt(MATURITY)
    growth = math.exp(-rate * MATURITY)
    price = spot * norm.cdf(d1) - STRIKE * growth * norm.cdf(d2)
    greeks = np.array([norm.cdf(d1), spot * norm.pdf(d1) * math.sqrt(MATURITY),
                       STRIKE * MATURITY * growth * norm.cdf(d2)])
    return price, greeks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    a = parser.parse_args(argv)
    if a.paths % a.shards:
        parser.error("--paths must be a multiple of --shards (one recording, one shape)")
    import dask.array as da
    from distributed import Client, LocalCluster

    from easyad.distributed import shard_value_and_gradient

    rows = a.paths // a.shards
    draws = np.random.default_rng(0).standard_normal(a.paths)
    per_shard = ad.record(discounted_payoffs, MARKET, draws[:rows])
    Z = da.from_array(draws, chunks=rows)

    cluster = LocalCluster(n_workers=a.workers, processes=True, threads_per_worker=1,
                           dashboard_address=None, silence_logs=50)
    with Client(cluster):
        start = time.perf_counter()
        total, gradient = shard_value_and_gradient(per_shard, MARKET, Z).compute()
        took = time.perf_counter() - start
    cluster.close()
    price, greeks = total / a.paths, gradient / a.paths

    # one process, the same shards in turn
    alone = [per_shard.value_and_gradient(MARKET, draws[k:k + rows])
             for k in range(0, a.paths, rows)]
    price_alone = sum(v for v, _ in alone) / a.paths
    greeks_alone = sum(g for _, g in alone) / a.paths
    assert abs(price - price_alone) <= 1e-12 * abs(price_alone), (price, price_alone)
    np.testing.assert_allclose(greeks, greeks_alone, rtol=1e-12)

    # the simulation's standard errors, from every path's payoff and derivatives
    spot, vol, rate = MARKET
    end = spot * np.exp((rate - 0.5 * vol ** 2) * MATURITY + vol * math.sqrt(MATURITY) * draws)
    growth, itm = math.exp(-rate * MATURITY), end > STRIKE
    paths = np.stack([growth * np.maximum(end - STRIKE, 0.0),
                      growth * itm * end / spot,
                      growth * itm * end * (math.sqrt(MATURITY) * draws - vol * MATURITY),
                      growth * itm * STRIKE * MATURITY])
    errors = paths.std(axis=1, ddof=1) / math.sqrt(a.paths)
    exact_price, exact_greeks = black_scholes(spot, vol, rate)
    print(f"{a.paths:,} paths in {a.shards} shards on {a.workers} workers: {took:.2f} s")
    print(f"{'':8s} {'Monte Carlo':>12s} {'closed form':>12s} {'std. error':>11s}")
    for name, mc, exact, err in zip(["price", "delta", "vega", "rho"],
                                    [price, *greeks], [exact_price, *exact_greeks], errors):
        print(f"{name:8s} {mc:12.6f} {exact:12.6f} {err:11.2e}")
        assert abs(mc - exact) <= 4 * err, f"{name}: {mc} vs {exact} (error {err})"


if __name__ == "__main__":
    main()
