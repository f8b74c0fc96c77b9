#!/usr/bin/env python3
"""Draws a request-rate sweep of `inferd-bench serve --request-rates ... --csv FILE`: throughput against p99 time
to first token and p99 time per output token, one point per rate.

    python3 tools/plot_sweep.py sweep.csv sweep.png [title]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    rate = [("inf" if float(r["request_rate"]) < 0 else r["request_rate"]) for r in rows]
    tput = [float(r["output_throughput"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in [(axes[0], "ttft_p99_ms", "p99 time to first token (ms)"),
                           (axes[1], "tpot_p99_ms", "p99 time per output token (ms)")]:
        ys = [float(r[key]) for r in rows]
        ax.plot(tput, ys, marker="o")
        for x, y, t in zip(tput, ys, rate):
            ax.annotate(f"{t}/s", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(sys.argv[3] if len(sys.argv) > 3 else "inferd request-rate sweep")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
