"""Units for people: byte sizes (formatting and parsing ``40GiB``, ``1.5 MB``, ``512``) and the
one check of every time argument (``check_seconds``)."""

from __future__ import annotations

import math
import numbers
import re
from decimal import Decimal
from fractions import Fraction

from jupyter_gpumem.data.sizes import GiB, KiB, MiB, TiB

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
}
#: The binary units ``format_bytes`` uses, smallest first.
BINARY_UNITS = (("B", 1), ("KiB", KiB), ("MiB", MiB), ("GiB", GiB), ("TiB", TiB))
#: Sizes of more digits than this are refused as too large (any limit is far below).
_DIGITS = 30
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KiB'``; exact bytes below 1 KiB; sign kept."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{int(n)} B"
    for unit, scale in BINARY_UNITS[1:]:
        value = n / scale
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.1f} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"
    raise AssertionError("unreachable")


def format_signed_bytes(n: float) -> str:
    """A change in bytes: ``'+1.5 KiB'``, ``'-512 B'``, ``'0 B'``."""
    return ("+" if n > 0 else "") + format_bytes(n)


def parse_bytes(text: str) -> int:
    """``'40GiB'`` → 42949672960. Raises ValueError naming the text on anything else."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try e.g. 512MiB, 40GiB or 2.5GB)")
    number = m.group(1)
    digits = Decimal(number).adjusted()  # 1e999GiB and 1e-99999999 cost no time
    if digits > _DIGITS:
        raise ValueError(f"not a size: {text!r} is too large")
    if digits < -_DIGITS:
        return 0
    # exact, not through a float: 9223372036854775807 is 2**63 - 1 bytes, not 2**63
    return int(Fraction(number) * _UNITS[unit])


#: The longest wait any time argument of ours may ask for: a day. Python's own timers overflow
#: somewhere past 2**33 s, and no view of ours waits that long.
MAX_SECONDS = 86_400.0
#: The longest interval between two samples of a live view: an hour.
MAX_INTERVAL = 3_600.0


def check_seconds(name: str, value: object, *, least: float = 0.0, least_ok: bool = False,
                  most: float = MAX_SECONDS, unit: str = "seconds") -> float:
    """``value`` as a float, for the time argument ``name`` (a timeout, an interval, a budget):
    a real number, not a bool, neither NaN nor infinite, above ``least`` (or equal to it with
    ``least_ok``) and at most ``most``. Otherwise ValueError naming the argument and the range,
    before the caller changes anything. Every timeout, interval and time budget of the package
    goes through here (a NaN passes ``timeout <= 0`` and then waits forever)."""
    v = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            v = float(value)
        except (OverflowError, ValueError):  # an int too large for a float
            v = math.nan
    if not (math.isfinite(v) and (v >= least if least_ok else v > least) and v <= most):
        low = "[" if least_ok else "("
        raise ValueError(f"{name} must be a number of {unit} in {low}{least:g}, {most:g}], "
                         f"got {value!r}")
    return v
