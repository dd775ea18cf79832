"""One colour per mechanism label, shared by the report's figures and MLflow's charts of a campaign."""

from __future__ import annotations

from collections.abc import Iterable

# The tag MLflow's UI reads a run's colour from (its own name, found in the UI's code: the colour picker
# writes it). Without it the UI hashes the run's id into 29 colours, so two mechanisms of one campaign
# could share a colour by chance.
RUN_COLOUR_TAG = "mlflow.runColor"


def mechanism_palette(labels: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    """One colour per mechanism label (RGB in [0, 1]), distinct for up to 20 labels."""
    import seaborn as sns  # a campaign's jobs that draw nothing do not pay its import

    ordered = sorted(set(labels))
    # "colorblind" has 10 colours; past that they would repeat, so switch to 20 distinct ones.
    palette = "colorblind" if len(ordered) <= 10 else "tab20"
    return dict(zip(ordered, sns.color_palette(palette, len(ordered))))


def mechanism_colours(labels: Iterable[str]) -> dict[str, str]:
    """`mechanism_palette` as '#rrggbb', the form MLflow's UI takes."""
    from matplotlib.colors import to_hex

    return {label: to_hex(colour) for label, colour in mechanism_palette(labels).items()}
