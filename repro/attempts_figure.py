"""Shared by the largest-model figures (offload_max_model, infinity_max_model,
infinity_tiling): a result's data.csv with the summary.csv beside it, and
the panel of every attempt: a line through the sizes that fit and an x at
each refused one.
"""
import csv
import os


def read_result(data_path):
    """data.csv's rows, and those of the summary.csv beside it."""
    with open(data_path, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(os.path.dirname(data_path), "summary.csv"), newline="") as f:
        summary = list(csv.DictReader(f))
    return rows, summary


def plot_attempts(ax, attempts, x, y, label, color=None, style="o-", markersize=6):
    """One series of attempts (rows with a "fits" column): y(row) against
    x(row), a line through those that fit and an x where a size was refused,
    in the line's color."""
    fit = [r for r in attempts if r["fits"] == "yes"]
    refused = [r for r in attempts if r["fits"] != "yes"]
    line, = ax.plot([x(r) for r in fit], [y(r) for r in fit], style, color=color, label=label,
                    markersize=markersize)
    ax.plot([x(r) for r in refused], [y(r) for r in refused], "x", color=line.get_color(), markersize=10)


def label_attempts(ax, xlabel, what, title):
    """The attempts panel's axes: `what` is the peak drawn, e.g. "device peak"."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("%s (MiB); x: refused at that point" % what)
    ax.set_title(title)
    ax.legend(fontsize=8)


def rate_note(r):
    """A summary row's last-step rate as a bar label's line ("" when it has
    none): TFLOPS and the fraction of it the device sat idle."""
    if not r.get("tflops"):
        return ""
    return "\n%.3g TFLOPS\n%.0f%% idle" % (float(r["tflops"]), 100 * float(r["device_idle_fraction"]))


def bar_largest(ax, measured, colors, note, fontsize):
    """Bars of each summary row's largest model (millions of parameters),
    each labelled with the model's name and the lines note(row) gives
    (none: ""); returns the heights."""
    xs = range(len(measured))
    heights = [int(r["largest_params"]) / 1e6 for r in measured]
    ax.bar(xs, heights, color=[colors.get(r["mode"], "#333") for r in measured])
    for x, r, h in zip(xs, measured, heights):
        label = (r["largest_model"] or "none") + note(r)
        ax.text(x, h, label, ha="center", va="bottom", fontsize=fontsize)
    ax.set_xticks(list(xs))
    return heights
