"""Figures the benchmarks print: percentiles and one table row of samples."""
import statistics


def pct(xs, p):
    """The p-th percentile of xs (nearest rank)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def samples_row(name, samples, p, name_width=14, count_width=8):
    """`name  count  median  p-th percentile  max`, two decimals."""
    return (f"  {name:<{name_width}}{len(samples):>{count_width}}{statistics.median(samples):>10.2f}"
            f"{pct(samples, p):>10.2f}{max(samples):>10.2f}")
