"""PNG plots of a simulation: allocation and queue length over time, delay CDFs.

Needs matplotlib (the ``bench`` extra); without it, says so and writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from synapse_ha.sim.engine import Result


def write_plots(results: list[Result], out: Path) -> list[str]:
    try:  # an optional dependency (the bench extra), imported only to plot
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["plots skipped: matplotlib is not installed (pip install -e '.[bench]')"]
    written = []
    for key, ylabel in (("allocation", "GPU allocation"), ("queue", "pending jobs")):
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for r in results:
            xs = [x for x, _ in r.series[key]]
            ys = [y for _, y in r.series[key]]
            ax.step(xs, ys, where="post", label=r.policy, linewidth=0.8)
        ax.set_xlabel("hours")
        ax.set_ylabel(ylabel)
        ax.legend()
        fig.tight_layout()
        path = out / f"{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(f"wrote {path}")
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        delays = sorted(r.delays_s)
        if delays:
            ax.plot(delays, [(i + 1) / len(delays) for i in range(len(delays))], label=r.policy)
    ax.set_xscale("symlog")
    ax.set_xlabel("queueing delay (s)")
    ax.set_ylabel("CDF")
    ax.legend()
    fig.tight_layout()
    path = out / "delay_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(f"wrote {path}")
    return written
