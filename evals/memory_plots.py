"""PNG plots of a memory sweep: its curves over the split and its block timelines.

Sweep rows are the dicts of evals/memory_sweep.py (columns documented there); static settings
draw the curve over the PRM fraction, auto and elastic are marked at the fraction they
used (elastic: its step-averaged PRM share of the KV pool).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402

MODELS = (("generator", "tab:blue"), ("prm", "tab:orange"))
_MARKERS = {"auto": ("*", "auto"), "elastic": ("D", "elastic")}


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _by_policy(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    static = sorted((r for r in rows if r["policy"] == "static"), key=lambda r: r["prm_fraction"])
    return static, [r for r in rows if r["policy"] != "static"]


def _versus_split(rows: list[dict], columns: list[tuple[str, str, str]], ylabel: str, title: str,
                  path: Path) -> Path:
    """One line per (column, label, colour) over the static splits; auto/elastic as markers."""
    static, adaptive = _by_policy(rows)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for column, label, colour in columns:
        ax.plot([r["prm_fraction"] for r in static], [r[column] for r in static], "o-", color=colour,
                label=f"{label} (static)")
        for row in adaptive:
            marker, name = _MARKERS[row["policy"]]
            ax.plot([row["prm_fraction"]], [row[column]], marker, color=colour, markersize=12,
                    markeredgecolor="black", label=f"{label} ({name})")
    ax.set_xlabel("PRM fraction of the KV budget")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_throughput(rows: list[dict], path: Path) -> Path:
    static, adaptive = _by_policy(rows)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([r["prm_fraction"] for r in static], [r["problems_per_s"] for r in static], "o-",
            color="tab:blue", label="static split")
    failed = [r for r in static if r.get("error")]
    if failed:
        ax.plot([r["prm_fraction"] for r in failed], [0] * len(failed), "x", color="tab:red", markersize=12,
                label="cannot hold a sequence")
    for row in adaptive:
        marker, name = _MARKERS[row["policy"]]
        ax.plot([row["prm_fraction"]], [row["problems_per_s"]], marker, markersize=14,
                markeredgecolor="black", label=f"{name} (at {row['prm_fraction']:.2f})")
        ax.axhline(row["problems_per_s"], linestyle="--", linewidth=0.8, color="gray")
    ax.set_xlabel("PRM fraction of the KV budget")
    ax.set_ylabel("problems / s")
    ax.set_title("Throughput vs memory split")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_hit_rate(rows: list[dict], path: Path) -> Path:
    return _versus_split(rows, [(f"{m}_hit_rate", m, c) for m, c in MODELS], "prefix-cache hit rate",
                         "Prefix-cache hit rate vs memory split", path)


def plot_thrash(rows: list[dict], path: Path) -> Path:
    return _versus_split(rows, [(f"{m}_thrash", m, c) for m, c in MODELS], "thrash events",
                         "Thrash (re-misses on evicted blocks) vs memory split", path)


def plot_blocks_over_steps(timelines: dict[str, dict], labels: list[str], path: Path,
                           phase_starts: dict[str, list[int]]) -> Path:
    """Blocks in use per step, both models, for each named setting (one panel each), with a
    vertical line where each later phase of the workload began."""
    fig, axes = plt.subplots(len(labels), 1, figsize=(8, 2.6 * len(labels)), squeeze=False)
    for ax, label in zip(axes[:, 0], labels):
        for name, colour in MODELS:
            timeline = timelines[label][name]
            ax.plot(timeline["steps"], timeline["in_use"], color=colour, label=f"{name} in use")
            owned = [u + c + f for u, c, f in zip(timeline["in_use"], timeline["cached"], timeline["free"])]
            ax.plot(timeline["steps"], owned, color=colour, linestyle=":", label=f"{name} owned")
        for step in phase_starts.get(label, []):
            ax.axvline(step, color="grey", linestyle="--", linewidth=1)
        ax.set_title(label, fontsize=10)
        ax.set_ylabel("KV blocks")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8, ncol=2)
    axes[-1, 0].set_xlabel("runtime step")
    return _save(fig, path)


def plot_sweep(rows: list[dict], timelines: dict[str, dict], timeline_labels: list[str],
               out_dir: Path, phase_starts: dict[str, list[int]]) -> list[Path]:
    return [
        plot_throughput(rows, out_dir / "throughput_vs_split.png"),
        plot_blocks_over_steps(timelines, timeline_labels, out_dir / "blocks_over_steps.png", phase_starts),
        plot_hit_rate(rows, out_dir / "hit_rate_vs_split.png"),
        plot_thrash(rows, out_dir / "thrash_vs_split.png"),
    ]
