"""Human-facing number formatting (one function per unit change)."""
from . import _C


def format_bytes(n: int) -> str:
    """Bytes as a person reads them: ``format_bytes(1536) == '1.50 KiB'``. The rule is C++'s
    (csrc/core/util/format_bytes.h, the one definition; the HTML pages' copy is
    _reporters/_html_assets/common.js); a negative count is its magnitude with a minus sign."""
    return "-" + _C.format_bytes(-n) if n < 0 else _C.format_bytes(n)


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
