"""Time spans as people read them in logs and status lines (no torch: ldpbench status imports it)."""


def duration(seconds: float) -> str:
    """0.4 s, 12 s, 3 min 05 s, 2 h 07 min."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
