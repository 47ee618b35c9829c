"""The compressed row exchange's conversions (issue 12), at the op level.

PackRowMessage with Tmessage=uint16 writes each float as bfloat16 bits, with
Tmessage=half as float16; UnpackRowMessage widens them back. The reference is
TensorFlow's own tf.cast, bit for bit, over:
* every one of the 65,536 16-bit patterns, widened (NaN compared as NaN:
  the payload TensorFlow gives a NaN is not part of the contract);
* a million random float32 bit patterns (every exponent: negative, tiny,
  subnormal, huge, inf, NaN) and the hand-picked ties and limits, narrowed;
* a message of several tables and workers with positions: unpack(pack(x))
  is x rounded once, each row in its place.
Then exchange_dtype's validation: what lookup_sparse accepts and the errors
naming what it refuses, before any table changes.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev
from sok_ev import row_exchange
from sok_ev._ops import ops

# Tmessage of each exchange dtype, and TensorFlow's type for its bits.
FORMATS = {
    "bfloat16": (tf.uint16, tf.bfloat16),
    "float16": (tf.float16, tf.float16),
}


def _bits16(message):
    """The 16-bit patterns of a message, as uint16."""
    return tf.bitcast(message, tf.uint16).numpy()


def _narrow(x, fmt):
    """x ([n] float32) through PackRowMessage as one table sent to one worker."""
    message_dtype, _ = FORMATS[fmt]
    rows = tf.constant(x.reshape(-1, 1))
    message, splits, _ = ops().sok_ev_pack_row_message([rows], [[len(x)]], [],
                                                       Tmessage=message_dtype)
    assert message.dtype == message_dtype
    np.testing.assert_array_equal(splits.numpy(), [len(x)])
    return _bits16(message)


def _widen(bits, fmt):
    """uint16 patterns through UnpackRowMessage: [n] float32."""
    message_dtype, _ = FORMATS[fmt]
    message = tf.bitcast(tf.constant(bits, tf.uint16), message_dtype)
    rows, = ops().sok_ev_unpack_row_message(message, [[len(bits)]], [], [], N=1, dims=[1])
    return rows.numpy().reshape(-1)


def _tf_narrow(x, fmt):
    return tf.bitcast(tf.cast(tf.constant(x), FORMATS[fmt][1]), tf.uint16).numpy()


def _tf_widen(bits, fmt):
    return tf.cast(tf.bitcast(tf.constant(bits, tf.uint16), FORMATS[fmt][1]), tf.float32).numpy()


def _assert_same_floats(got, expected):
    """Bit for bit, except that a NaN only has to be a NaN."""
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


def _assert_same_bits(got, expected, fmt):
    nan = np.isnan(_tf_widen(expected, fmt))
    np.testing.assert_array_equal(np.isnan(_tf_widen(got, fmt)), nan)
    np.testing.assert_array_equal(got[~nan], expected[~nan])


def _special_floats():
    """Signed zeros, the extremes of float32, and the ties and overflow edges
  of both formats, each also negated."""
    values = [
        0.0, 1.0, 65504.0, 65519.99, 65520.0, 65536.0, 2.0**-14, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25,
        2.0**-26, 1.5 * 2.0**-24, 2.5 * 2.0**-24, 6e-8, 1e-40, 1e-45, 3.4028235e38, 1.17549435e-38,
        np.inf, np.nan, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11,
        1.0 + 2.0**-8 + 2.0**-20, 0.1, 1.0 / 3.0, 3.3895314e38
    ]
    x = np.array(values, np.float32)
    return np.concatenate([x, -x])


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_widening_every_16_bit_pattern_equals_tf_cast(fmt):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    _assert_same_floats(_widen(bits, fmt), _tf_widen(bits, fmt))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_narrowing_random_float_bit_patterns_equals_tf_cast(fmt):
    rng = np.random.default_rng(12)
    x = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    _assert_same_bits(_narrow(x, fmt), _tf_narrow(x, fmt), fmt)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_narrowing_ties_limits_and_specials_equals_tf_cast(fmt):
    x = _special_floats()
    _assert_same_bits(_narrow(x, fmt), _tf_narrow(x, fmt), fmt)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_narrowing_normal_range_values_equals_tf_cast(fmt):
    """Values of every magnitude a row or gradient takes, both signs."""
    rng = np.random.default_rng(13)
    x = (rng.normal(size=1 << 16) * 10.0**rng.uniform(-12, 12, size=1 << 16)).astype(np.float32)
    _assert_same_bits(_narrow(x, fmt), _tf_narrow(x, fmt), fmt)


def test_nan_stays_nan_and_inf_stays_inf():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf], np.float32)
    for fmt in FORMATS:
        back = _widen(_narrow(x, fmt), fmt)
        assert np.isnan(back[:2]).all(), fmt
        np.testing.assert_array_equal(back[2:], [np.inf, -np.inf])


def test_float16_overflows_to_inf_and_bfloat16_keeps_the_range():
    x = np.array([65519.0, 65520.0, 1e30, -1e30], np.float32)
    np.testing.assert_array_equal(_widen(_narrow(x, "float16"), "float16"),
                                  [65504.0, np.inf, np.inf, -np.inf])
    np.testing.assert_allclose(_widen(_narrow(x, "bfloat16"), "bfloat16"), x, rtol=2.0**-8)


@pytest.mark.parametrize("fmt,eps", [("bfloat16", 2.0**-8), ("float16", 2.0**-11)])
def test_relative_error_is_at_most_half_an_ulp_and_reaches_it(fmt, eps):
    """The bound lookup_sparse documents. bfloat16 keeps 8 significant bits,
  so its bound is 2^-8, and 1 + 2^-8 (a tie, rounded to 1) nearly reaches it."""
    rng = np.random.default_rng(15)
    x = (rng.uniform(1, 2, size=1 << 16) * 2.0**rng.integers(-14, 15, size=1 << 16))
    x = np.concatenate([x, [1 + eps, 1 + 3 * eps]]).astype(np.float32)
    error = np.abs(_widen(_narrow(x, fmt), fmt).astype(np.float64) - x) / np.abs(x)
    assert error.max() <= eps
    assert error.max() >= eps / (1 + 3 * eps)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_unpack_of_pack_is_each_row_rounded_once_in_its_place(fmt):
    """3 tables (dims 5, 1, 3), 2 workers, with positions: the rows come
  back where the positions say, each element tf.cast-rounded."""
    message_dtype, tf_dtype = FORMATS[fmt]
    rng = np.random.default_rng(14)
    dims = [5, 1, 3]
    counts = np.array([[3, 2], [0, 4], [1, 0]], np.int64)
    rows = [rng.normal(size=(c.sum(), d)).astype(np.float32) * 100 for c, d in zip(counts, dims)]
    positions = [rng.permutation(c.sum()).astype(np.int64) for c in counts]
    message, splits, _ = ops().sok_ev_pack_row_message([tf.constant(r) for r in rows],
                                                       counts,
                                                       positions,
                                                       Tmessage=message_dtype)
    np.testing.assert_array_equal(splits.numpy(), (counts * np.array(dims)[:, None]).sum(0))
    back = ops().sok_ev_unpack_row_message(message, counts, positions, [], N=3, dims=dims)
    for t, (got, x) in enumerate(zip(back, rows)):
        expected = tf.cast(tf.cast(x, tf_dtype), tf.float32).numpy()
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=f"table {t}")


@pytest.mark.parametrize("value,expected", [
    (tf.float32, tf.float32),
    (tf.bfloat16, tf.bfloat16),
    (tf.float16, tf.float16),
    ("float32", tf.float32),
    ("bfloat16", tf.bfloat16),
    ("float16", tf.float16),
])
def test_exchange_dtype_accepts_float32_bfloat16_float16_as_dtype_or_name(value, expected):
    assert row_exchange.check_exchange_dtype(value) == expected


@pytest.mark.parametrize("value,error", [
    (tf.float64, ValueError),
    (tf.int32, ValueError),
    ("int8", ValueError),
    ("bf16", ValueError),
    (16, TypeError),
    (None, TypeError),
    (np.float16, TypeError),
])
def test_bad_exchange_dtype_is_refused_naming_it_before_any_table_changes(value, error):
    table = _table(embedding_dim=3)
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([7, 42], tf.int64), [2, 1])
    with pytest.raises(error) as raised:
        sok_ev.lookup_sparse([table], [ids], exchange_dtype=value)
    assert "exchange_dtype" in str(raised.value) and repr(value) in str(raised.value)
    assert int(table.total_count()) == 0


def test_exchange_dtype_has_no_effect_with_one_worker():
    ids = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([7, 9, 7], tf.int64), [3, 2])
    rows = [
        sok_ev.lookup_sparse([_table(embedding_dim=4)], [ids], "sum",
                             exchange_dtype=dtype)[0].numpy()
        for dtype in (tf.float32, tf.bfloat16, "float16")
    ]
    # 0.1 has no exact bfloat16 or float16 value: a rounded exchange would show.
    np.testing.assert_array_equal(rows[0], np.full([3, 4], 0.1, np.float32) * [[2], [0], [1]])
    np.testing.assert_array_equal(rows[1], rows[0])
    np.testing.assert_array_equal(rows[2], rows[0])


_TABLES = iter(range(1 << 30))


def _table(embedding_dim):
    """A new int64 table whose keys start at 0.1 everywhere."""
    return sok_ev.get_embedding_variable(f"compressed_exchange_{next(_TABLES)}",
                                         embedding_dim=embedding_dim,
                                         key_dtype=tf.int64,
                                         initializer=tf.constant_initializer(0.1))
