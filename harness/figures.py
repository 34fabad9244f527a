"""How a figure is printed beside the threshold it is judged against."""


def shown_apart(value: float, mark: float, digits: int, most: int = 6) -> str:
    """`value` with `digits` decimals, or more (up to `most`) where it would print as `mark` without being it: a
    figure judged against a threshold never reads as the threshold (p=0.050 beside "slower" at alpha 0.05)."""
    while digits < most and f"{value:.{digits}f}" == f"{mark:.{digits}f}" and value != mark:
        digits += 1
    return f"{value:.{digits}f}"


def count_of(n: int, noun: str) -> str:
    """`n` and `noun`, plural where n is not 1 ("1 cell", "2 cells")."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
