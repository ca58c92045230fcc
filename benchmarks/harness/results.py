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


def publish(out, header, tables, data):
    """Prints the header and the tables, blank lines between, and writes them and the measurements
    (write)."""
    text = "\n\n".join([header, *tables])
    print()
    print(text)
    write(out, text, data)


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
    labels = list(dict.fromkeys(label for panel in panels.values() for label in panel.get("lines", {})))
    colors = {label: plt.cm.tab20(i % 20) if len(labels) > 10 else f"C{i}" for i, label in enumerate(labels)}
    shared = len(labels) > 6  # one legend below the panels, not one over each
    legend_rows = -(-len(labels) // 3) if shared else 0
    height = 4 * nrows + 0.25 * legend_rows
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, height), squeeze=False)
    for axis, (title, panel) in zip(axes.flat, panels.items()):
        for label, (xs, ys) in panel.get("lines", {}).items():
            axis.plot(xs, ys, marker="o", label=label, color=colors[label])
        for label, y in panel.get("levels", {}).items():
            axis.axhline(y, linestyle="--", linewidth=1, color="black")
            axis.annotate(label, (0, y), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
        if logx:
            axis.set_xscale("log", base=2 if logx == 2 else 10)
        if logx != 10 and logx is not True:  # the values measured at, as they are (batch sizes, workers)
            ticks = sorted({x for xs, _ in panel.get("lines", {}).values() for x in xs})
            axis.set_xticks(ticks, [str(t) for t in ticks])
            axis.minorticks_off()
        if logy:
            axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel(panel.get("ylabel", ylabel))
        axis.set_title(title, fontsize=10)
        if not shared:
            axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    if shared:
        handles = [plt.Line2D([], [], color=colors[label], marker="o") for label in labels]
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.25 * legend_rows / height + (0.02 if shared else 0), 1, 1))
    save(fig, path)
    plt.close(fig)


def bar_plots(path, panels, ylabel, colors=None, logy=True, ncols=None):
    """Grouped bars, one panel per entry of panels: {title: {"groups": [group], "bars": {label: [value per
    group]}, "levels": {label: y}}}; levels as dashed horizontal lines (the limits); one legend below."""
    plt = pyplot()
    if plt is None or not panels:
        return
    ncols = ncols or min(len(panels), 2)
    nrows = -(-len(panels) // ncols)
    labels = list(dict.fromkeys(label for panel in panels.values() for label in panel["bars"]))
    colors = {label: (colors or {}).get(label, f"C{i}") for i, label in enumerate(labels)}
    legend_rows = -(-len(labels) // 4)
    height = 5 * nrows + 0.25 * legend_rows
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, height), squeeze=False)
    for axis, (title, panel) in zip(axes.flat, panels.items()):
        groups, bars = panel["groups"], panel["bars"]
        width = 0.8 / max(len(bars), 1)
        for i, (label, values) in enumerate(bars.items()):
            axis.bar([g + i * width for g in range(len(groups))], values, width, label=label, color=colors[label])
        for label, y in panel.get("levels", {}).items():
            axis.axhline(y, linestyle="--", linewidth=1, color="black")
            axis.annotate(label, (0, y), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
        axis.set_xticks([g + width * (len(bars) - 1) / 2 for g in range(len(groups))], groups)
        if logy:
            axis.set_yscale("log")
        axis.set_ylabel(ylabel)
        axis.set_title(title, fontsize=10)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[label]) for label in labels]
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.25 * legend_rows / height + 0.02, 1, 1))
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
