import pytest

from ingero.commands.options import parse_duration, parse_size


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("2m", 120), ("1h30m", 5400),
                                            ("1.5h", 5400), ("250ms", 0.25), ("1d", 86400), ("2m30s", 150)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "10x", "1h30", "-5s", "0s", "s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text, n", [("10GB", 10**10), ("512MiB", 512 * 2**20), ("1000", 1000), ("1.5 gb", 1.5e9)])
def test_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_bad_size() -> None:
    with pytest.raises(ValueError):
        parse_size("ten")
