"""Human-facing number formatting (one function per unit change)."""

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int) -> str:
    """Bytes as a person reads them: ``format_bytes(1536) == '1.50 KiB'``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    unit = 0
    while value >= 1024.0 and unit < len(_UNITS) - 1:
        value /= 1024.0
        unit += 1
    if value < 10:
        return f"{value:.2f} {_UNITS[unit]}"
    if value < 100:
        return f"{value:.1f} {_UNITS[unit]}"
    return f"{value:.0f} {_UNITS[unit]}"


def format_count(n: int) -> str:
    """A parameter count: ``format_count(1_234_567) == '1.23 M'``."""
    for divisor, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if n >= divisor:
            return f"{n / divisor:.2f}{suffix}"
    return str(n)


def ns_to_ms(ns: int) -> float:
    """Nanoseconds to milliseconds."""
    return ns / 1e6
