"""The axes every figure of the report shares: accuracy and AUC in percent, the unit of its tables; log
scales with labelled ticks whatever their span (matplotlib labels only the powers of the base, so an
axis of costs within one decade had no label at all); a constant predictor's level drawn and named."""

from __future__ import annotations

import math

from matplotlib.ticker import EngFormatter, FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, PercentFormatter

# The tick multiples of each power of ten, coarse to fine: the first that puts two ticks inside the axis.
MULTIPLES = ((1,), (1, 2, 5), tuple(range(1, 10)))
# At most this many labels on an axis (every second power, or third, ... where more would crowd it).
MOST_TICKS = 7


def percent_axis(ax, label: str) -> None:
    """The y axis of a fraction (accuracy, AUC) in percent, as the tables give it."""
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=None))
    ax.set_ylabel(f"{label} (%)")


def labelled_log_axis(ax, base: int = 10) -> None:
    """The x axis (already on a log scale, its data drawn) with two to MOST_TICKS labelled ticks inside its
    limits: the powers of `base`, else (base 10) their 2 and 5 multiples, else every digit's, else evenly
    spaced values. Base 2 (ε) reads as plain numbers (0.5, 1, 2, ...), base 10 (bits) with SI prefixes (2M)."""
    low, high = ax.get_xlim()
    ticks: list[float] = []
    for multiples in MULTIPLES if base == 10 else MULTIPLES[:1]:
        ticks = [multiple * base ** power
                 for power in range(math.floor(math.log(low, base)), math.ceil(math.log(high, base)) + 1)
                 for multiple in multiples if low <= multiple * base ** power <= high]
        if len(ticks) >= 2:
            break
    if len(ticks) < 2:  # narrower than from one digit to the next
        ticks = [tick for tick in MaxNLocator(nbins=3).tick_values(low, high) if low <= tick <= high]
    ticks = ticks[::math.ceil(len(ticks) / MOST_TICKS)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}") if base == 2 else EngFormatter(sep=""))
    ax.xaxis.set_minor_formatter(NullFormatter())


def constant_line(ax, level: tuple[float, str] | None) -> None:
    """A constant predictor's level (report.constant_level) as a dotted grey line, named on the axis
    itself (the legend of a seaborn figure lists its hues only)."""
    if level is None:
        return
    ax.axhline(level[0], color="grey", linestyle=":", label=level[1])
    ax.annotate(level[1], (0.01, level[0]), xycoords=("axes fraction", "data"), xytext=(0, 2),
                textcoords="offset points", color="grey", fontsize="small", va="bottom")
