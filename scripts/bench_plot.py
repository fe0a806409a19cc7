"""The zoo benchmark's PNG (scripts/bench_report.py --png): one panel per job, device memory in use
saved (GiB, y) against the step time's ratio to the baseline (x, log scale), each variant a labelled
point (filled on the Pareto front, hollow off it, crossed where its losses differ from the
baseline's), the job's link bound a dashed horizontal line. Needs matplotlib (Debian's
python3-matplotlib, scripts/setup.sh); without it draw() says so and draws nothing."""

import math

COLUMNS = 3
FRONT, OFF_FRONT, WRONG, BOUND = "#1f77b4", "#7f7f7f", "#d62728", "#2ca02c"
RATIO_TICKS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 4, 6, 8, 10, 15, 20)
LABEL_CHAR_PT, LABEL_HEIGHT_PT = 4.0, 8.0  # a 7 pt label's width per character and height, roughly
LABEL_OFFSETS = ((5, 3), (5, -10), (-5, 3), (-5, -10), (5, 13), (5, -20), (-5, 13), (-5, -20), (5, 23), (5, -30),
                 (-5, 23), (-5, -30))


def draw(report, path, columns=COLUMNS):
    """(drawn, message): the figure of `report` (bench_report.build_report) written to `path`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        return False, ("no PNG: matplotlib is not installed here (%s); run `scripts/bench.sh --report` where "
                       "it is (the CPU machine: python3-matplotlib)" % error)
    jobs = list(report["jobs"].items())
    if not jobs:
        return False, "no PNG: no job has results"
    columns = max(1, min(columns, len(jobs)))
    rows = int(math.ceil(len(jobs) / float(columns)))
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.2 * rows), squeeze=False)
    labels = [panel(axes[index // columns][index % columns], job, data) for index, (job, data) in enumerate(jobs)]
    for index in range(len(jobs), rows * columns):
        axes[index // columns][index % columns].axis("off")
    dates = sorted({d["date"] for _, d in jobs if d["date"]})
    devices = sorted({d["device"] for _, d in jobs if d["device"]})
    figure.suptitle("device memory saved against step time, baseline the job as is\n%s" % "; ".join(
        devices + dates), fontsize=9)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (4.2 * rows)))
    for ax, (points, bound) in zip((axes[i // columns][i % columns] for i in range(len(jobs))), labels):
        place_labels(ax, points, bound)  # once the layout has fixed where each point lands
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True, "drawn: %s" % path


def panel(ax, job, data):
    """Draws a job's points, bound and axes; returns ([(x, y, label, colour)], link bound GiB or None)
    for place_labels."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    points = [r for r in data["rows"] if r["ratio"] is not None and r["saved_gib"] is not None]
    labels = []
    failed = [r["variant"] for r in data["rows"] if r["ok"] == 0]
    for row in points:
        wrong = row["losses"]["equal"] is False
        colour = WRONG if wrong else FRONT if row["front"] else OFF_FRONT
        if wrong:
            ax.scatter([row["ratio"]], [row["saved_gib"]], s=42, marker="x", c=colour, zorder=3)
        else:
            ax.scatter([row["ratio"]], [row["saved_gib"]], s=42, marker="o", edgecolors=colour, zorder=3,
                       facecolors=colour if row["front"] else "none")
        labels.append((row["ratio"], row["saved_gib"], row["variant"], colour))
    ax.set_xscale("log")
    ratios = [r["ratio"] for r in points] + [1.0]
    low, high = min(ratios) / 1.08, max(max(ratios) * 1.25, 1.2)
    ax.set_xlim(low, high)
    ticks = thin_ticks([t for t in RATIO_TICKS if low <= t <= high], low, high)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FixedFormatter(["x%g" % t for t in ticks]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.axvline(1.0, color="#bbbbbb", linewidth=0.8, zorder=1)
    ax.axhline(0.0, color="#bbbbbb", linewidth=0.8, zorder=1)
    bound = data["link"]["bound_gib"]
    if bound is not None:
        ax.axhline(bound, color=BOUND, linestyle="--", linewidth=1.0, zorder=2)
    saved = [r["saved_gib"] for r in points] + [0.0] + ([bound] if bound is not None else [])
    span = max(saved) - min(saved) or 1.0
    ax.set_ylim(min(saved) - 0.08 * span, max(saved) + 0.15 * span)
    ax.set_title(job, fontsize=10)
    ax.set_xlabel("step time / baseline's (log)", fontsize=8)
    ax.set_ylabel("device memory saved, GiB", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    if failed:
        ax.text(0.98, 0.02, "failed: " + ", ".join(failed), transform=ax.transAxes, ha="right", va="bottom",
                fontsize=7, color=WRONG)
    return labels, bound


def thin_ticks(ticks, low, high, per_axis=7):
    """The ticks at least 1/per_axis of the axis' log width apart, x1 always kept."""
    gap = (math.log(high) - math.log(low)) / per_axis
    kept = [1.0] if 1.0 in ticks else []
    for tick in ticks:
        if all(abs(math.log(tick) - math.log(other)) >= gap for other in kept):
            kept.append(tick)
    return sorted(kept)


def place_labels(ax, labels, bound=None):
    """Each label beside its point, at the first of a few offsets where its box stays inside the
    panel and overlaps no label placed before it and no point (the variants near the baseline crowd
    around x1, 0 GiB)."""
    to_pixels = ax.transData.transform
    dpi_scale = ax.figure.dpi / 72.0
    points = [to_pixels((x, y)) for x, y, _, _ in labels]
    taken = [(px - 4, py - 4, px + 4, py + 4) for px, py in points]
    frame = ax.get_window_extent().extents
    if bound is not None:  # the bound's label at the right end of its line, kept clear of the others'
        text = "link bound %.2f GiB" % bound
        y = to_pixels((1.0, bound))[1]
        taken.append((frame[2] - (LABEL_CHAR_PT * len(text) + 4) * dpi_scale, y,
                      frame[2], y + (LABEL_HEIGHT_PT + 3) * dpi_scale))
        ax.annotate(text, (1.0, bound), xycoords=("axes fraction", "data"), textcoords="offset points",
                    xytext=(-3, 3), ha="right", fontsize=7, color=BOUND)
    for (x, y, text, colour), (px, py) in zip(labels, points):
        width, height = LABEL_CHAR_PT * len(text) * dpi_scale, LABEL_HEIGHT_PT * dpi_scale

        def box_at(dx, dy):
            left = px + dx * dpi_scale - (width if dx < 0 else 0)
            return (left, py + dy * dpi_scale, left + width, py + dy * dpi_scale + height)

        free = [(dx, dy) for dx, dy in LABEL_OFFSETS if _inside(box_at(dx, dy), frame)
                and not any(_overlap(box_at(dx, dy), other) for other in taken)]
        dx, dy = free[0] if free else LABEL_OFFSETS[0]  # crowded beyond the offsets: overlap the first
        taken.append(box_at(dx, dy))
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7, color=colour,
                    ha="right" if dx < 0 else "left")


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(box, frame):
    return frame[0] <= box[0] and box[2] <= frame[2] and frame[1] <= box[1] and box[3] <= frame[3]
