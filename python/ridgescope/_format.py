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


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
               "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
               "gib": 1024**3, "tib": 1024**4}


def parse_bytes(value: "int | str") -> int:
    """A size from an int or a string: ``parse_bytes("2GiB") == 2 * 1024**3``, ``"1.5GB"``,
    ``"512MiB"``, ``"1000"``. Raises ValueError naming the problem."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"a size must be positive, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"not a size: {value!r} (use bytes as an int, or a string like '2GiB')")
    text = value.strip().replace("_", "")
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
    unit = text[len(number):].strip().lower()
    try:
        amount = float(number)
    except ValueError:
        raise ValueError(f"not a size: {value!r} (use bytes as an int, or a string like '2GiB')") from None
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown unit {unit!r} in {value!r} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    size = int(amount * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"a size must be positive, got {value!r}")
    return size
