import pytest
from hypothesis import given
from hypothesis import strategies as st

from simdist.units import UnitError, parse_bandwidth, parse_duration, parse_rate, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("300 GB/s", 300e9), ("200 Gb/s", 25e9), ("1.6 Tb/s", 200e9), ("2.0 TB/s", 2e12),
     ("25 Gbps", 3.125e9), ("64 GiB/s", 64 * 2**30)],
)
def test_bandwidth_bits_and_bytes_by_case(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "expected"), [("3 us", 3e-6), ("500 ns", 5e-7), ("0.01 ms", 1e-5),
                                                ("10 min", 600), ("50000 h", 1.8e8)])
def test_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


def test_size_binary_and_decimal():
    assert parse_size("80 GiB") == 80 * 2**30
    assert parse_size("141 GB") == 141e9
    assert parse_size("25 MiB") == 25 * 2**20


def test_rate():
    assert parse_rate("2e9 params/s") == 2e9


@pytest.mark.parametrize("bad", [300, "300", "300 GB", "fast", "-5 GB/s", None, True])
def test_bare_numbers_and_wrong_units_are_errors(bad):
    with pytest.raises(UnitError):
        parse_bandwidth(bad)


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
def test_bandwidth_roundtrip(x):
    assert parse_bandwidth(f"{x!r} GB/s") == pytest.approx(x * 1e9)
    assert parse_bandwidth(f"{x!r} Gb/s") == pytest.approx(x * 1e9 / 8)


@pytest.mark.parametrize("bad", ["1e400 GB/s", "1e308 TB/s", "３００ GB/s", "３ us", "nan GB/s", "inf GB/s",
                                 "300\u00a0GB/s", "0x10 GB/s", "1" * 70 + " GB/s", "1e-400 GB/s", "300 GB/s/s"])
def test_non_finite_huge_and_non_ascii_quantities_are_refused(bad):
    with pytest.raises(UnitError):
        parse_bandwidth(bad) if "B" in bad else parse_duration(bad)


def test_micro_sign_is_a_microsecond():
    assert parse_duration("3 µs") == pytest.approx(3e-6)


def test_error_messages_stay_short_for_huge_inputs():
    from simdist.units import short_repr

    with pytest.raises(UnitError) as exc:
        parse_size(["x" * 10_000] * 1000)
    assert len(str(exc.value)) < 200
    assert short_repr(10**5000) == "a 16610-bit integer"
