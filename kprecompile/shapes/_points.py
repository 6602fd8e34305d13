"""The integer points a plan walks: one per Triton integer class, one per power-of-two bucket."""

from __future__ import annotations


def geometric_points(low: int, high: int) -> tuple[int, ...]:
    """Integers from low to high, each at most 1.5x the previous: one in every power-of-two bucket."""
    points, value = [], low
    while value < high:
        points.append(value)
        value = max(value + 1, value * 3 // 2)
    points.append(high)
    return tuple(sorted(set(point for point in points if low <= point <= high)))


def int_class_representatives(high: int, low: int = 1) -> tuple[int, ...]:
    """One integer per Triton integer class reachable in [low, high]: 1, a multiple of 16, another."""
    candidates = (1, 16, 2, 17, 32, 3)
    chosen: dict[str, int] = {}
    for value in (*candidates, low, high):
        if low <= value <= high:
            kind = "one" if value == 1 else "div16" if value % 16 == 0 else "other"
            chosen.setdefault(kind, value)
    return tuple(sorted(chosen.values()))
