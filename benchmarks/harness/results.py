"""Writing results: the table as text (PREFIX.txt), the measurements as JSON (PREFIX.json), and plots
(PREFIX.png) where matplotlib is installed (a line says so where it is not)."""

import json
import os


def write(out, text, data):
    """PREFIX.txt (the table, as printed) and PREFIX.json (the measurements)."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".txt", "w") as f:
        f.write(text.rstrip("\n") + "\n")
    with open(out + ".json", "w") as f:
        json.dump(data, f, indent=1)
    print(f"\nwritten: {out}.txt, {out}.json")


def read_json(out):
    with open(out + ".json") as f:
        return json.load(f)


def markdown(header, rows):
    """A markdown table: header cells, then rows of cells (already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot without a display, or None (with a line saying so) where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    return plt


def save(fig, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def line_plots(path, panels, xlabel, ylabel, logx=True, logy=True, ncols=None):
    """One panel per entry of panels: {title: {"lines": {label: (xs, ys)}, "levels": {label: y}, "ylabel": ...}};
    levels are drawn as dashed horizontal lines (a limit that does not depend on x); a panel's ylabel
    replaces the common one. Nothing where matplotlib is missing."""
    plt = pyplot()
    if plt is None or not panels:
        return
    ncols = ncols or min(len(panels), 3)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 4 * nrows), squeeze=False)
    for axis, (title, panel) in zip(axes.flat, panels.items()):
        for label, (xs, ys) in panel.get("lines", {}).items():
            axis.plot(xs, ys, marker="o", label=label)
        for label, y in panel.get("levels", {}).items():
            axis.axhline(y, linestyle="--", linewidth=1, color="black" if len(panel["levels"]) == 1 else None)
            axis.annotate(label, (0, y), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
        if logx:
            axis.set_xscale("log", base=2 if logx == 2 else 10)
        if logy:
            axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel(panel.get("ylabel", ylabel))
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def bar_plots(path, panels, ylabel, colors=None, logy=True, ncols=None):
    """Grouped bars, one panel per entry of panels: {title: {"groups": [group], "bars": {label: [value per
    group]}, "levels": {label: y}}}; levels as dashed horizontal lines (the limits)."""
    plt = pyplot()
    if plt is None or not panels:
        return
    ncols = ncols or min(len(panels), 2)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 5 * nrows), squeeze=False)
    for axis, (title, panel) in zip(axes.flat, panels.items()):
        groups, bars = panel["groups"], panel["bars"]
        width = 0.8 / max(len(bars), 1)
        for i, (label, values) in enumerate(bars.items()):
            color = (colors or {}).get(label)
            axis.bar([g + i * width for g in range(len(groups))], values, width, label=label, color=color)
        for label, y in panel.get("levels", {}).items():
            axis.axhline(y, linestyle="--", linewidth=1, color="black")
            axis.annotate(label, (0, y), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
        axis.set_xticks([g + width * (len(bars) - 1) / 2 for g in range(len(groups))], groups)
        if logy:
            axis.set_yscale("log")
        axis.set_ylabel(ylabel)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


class Report:
    """Lines printed as they come (a long run shows its progress) and kept for PREFIX.txt."""

    def __init__(self):
        self.lines = []

    def __call__(self, text=""):
        print(text, flush=True)
        self.lines.extend(str(text).split("\n"))

    def text(self):
        return "\n".join(self.lines)
