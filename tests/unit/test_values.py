"""ingero.values: every parser returns a value or raises one BadValue (an IngeroError), never
another exception; NaN, infinities, negatives and values below a floor are refused."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero import values
from ingero.daemon import protocol
from ingero.errors import IngeroError

PARSERS = [values.parse_duration, values.parse_window, values.parse_size, values.parse_count,
           values.parse_time, values.parse_time_ns, values.parse_command]

ANY_VALUE = st.one_of(
    st.text(), st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.integers(min_value=-(2**200), max_value=2**200), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e309", "-1s", "0", "0s", "1e-320", "9" * 400,
                     "1h30m", "2026-01-31T14:05:00", "0001-01-01T00:00:00", "  ", "1e308d"]),
)


@pytest.mark.parametrize("parse", PARSERS, ids=lambda p: p.__name__)
@settings(max_examples=400, deadline=None)
@given(value=ANY_VALUE)
def test_a_value_or_one_ingero_error(parse, value):
    try:
        out = parse(value)
    except IngeroError as exc:
        assert isinstance(exc, values.BadValue) and "\n" not in str(exc)
        return
    if isinstance(out, float):
        assert math.isfinite(out) and out > 0


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "infinity", "1e309"])
def test_non_finite_durations_are_refused(text):
    # finding 7: --duration nan/inf were accepted and never ended
    with pytest.raises(values.BadValue, match="not a finite number|more than the limit"):
        values.parse_duration(text, "--duration")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0, "nan"])
def test_non_finite_or_non_positive_numbers_are_refused(value):
    with pytest.raises(values.BadValue):
        values.parse_duration(value, "timeout_s")


def test_window_below_the_floor_says_the_floor_and_why():
    # finding 9: --window 0.000001s gave 12153083 windows and a 1812% share
    with pytest.raises(values.BadValue) as err:
        values.parse_window("0.000001s", "--window")
    assert "floor of 1 s" in str(err.value) and "once a second" in str(err.value)
    assert values.parse_window("1s") == 1.0


@pytest.mark.parametrize("text", ["nan", "inf", "-5", "1e400"])
def test_bad_times(text):
    # finding 8: --since/--window nan ended in "cannot convert float NaN to integer"
    with pytest.raises(values.BadValue):
        values.parse_time(text, "--from")


def test_counts():
    assert values.parse_count("42") == 42 and values.parse_count(7.0) == 7
    for bad in (float("nan"), 1.5, True, "1e3", 0, -3, "x"):
        with pytest.raises(values.BadValue):
            values.parse_count(bad, "max_rows")


def test_empty_command_is_refused():
    # finding 10: --cmd "" traced every process on the host
    for bad in ("", "   "):
        with pytest.raises(values.BadValue, match="empty command"):
            values.parse_command(bad)


# -- the socket's request decoder ----------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
REQUEST = st.fixed_dictionaries(
    {}, optional={"sql": JSON | st.text(), "op": st.sampled_from(["status", "explain", "x"]) | JSON,
                  "args": JSON | st.dictionaries(st.sampled_from(sorted(protocol.EXPLAIN_ARGS) + ["zz"]), JSON),
                  "max_rows": JSON, "timeout_s": JSON})


@settings(max_examples=600, deadline=None)
@given(obj=REQUEST | JSON)
def test_request_decoder_returns_a_request_or_one_ingero_error(obj):
    try:
        req = protocol.decode_request(obj)
    except IngeroError as exc:
        assert isinstance(exc, protocol.BadRequest) and exc.fields
        return
    assert math.isfinite(req.timeout_s) and 0 < req.timeout_s <= protocol.MAX_TIMEOUT_S
    assert 1 <= req.max_rows <= protocol.MAX_ROWS_CAP


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200) | st.integers(0, 5000).map(lambda n: b"[" * n + b"]" * n))
def test_message_decoder_returns_an_object_or_protocol_error(body):
    try:
        assert isinstance(protocol.decode(body), dict)
    except protocol.ProtocolError:
        pass


def test_each_bad_field_is_named():
    # findings 1 and 3: NaN timeout_s lifted the time limit; NaN max_rows got no reply
    with pytest.raises(protocol.BadRequest) as err:
        protocol.decode_request({"sql": "SELECT 1", "timeout_s": float("nan"), "max_rows": float("nan")})
    assert set(err.value.fields) == {"timeout_s", "max_rows"}
    with pytest.raises(protocol.BadRequest) as err:
        protocol.decode_request({"op": "explain", "args": {"window_s": 1e-6, "since_s": float("inf"), "pids": [-1]}})
    assert set(err.value.fields) == {"args.window_s", "args.since_s", "args.pids"}


def test_deep_nesting_is_refused_before_parsing():
    body = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(protocol.ProtocolError, match="nested deeper"):
        protocol.decode(body)
    assert protocol.nesting_depth(b'{"a": "[[[[[[[[[[[[[["}') == 1


@pytest.mark.parametrize("parse", [values.parse_duration, values.parse_size, values.parse_count, values.parse_time,
                                   values.parse_percent], ids=lambda p: p.__name__)
@pytest.mark.parametrize("text", ["٣", "３s", "1٠", "²"])
def test_digits_of_other_scripts_are_refused(parse, text):
    """int('٣') is 3 and float('３') is 3.0: --max-rows ٣ read as 3 before."""
    with pytest.raises(values.BadValue, match="other than ASCII"):
        parse(text)
