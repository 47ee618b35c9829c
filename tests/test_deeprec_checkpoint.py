"""Checkpoints in DeepRec's Embedding Variable layout, both ways.

A checkpoint written here from NumPy with tf.raw_ops.SaveV2, tensor for
tensor as DeepRec saves an Embedding Variable N (N-keys, -values, -freqs,
-versions, -keys_filtered, -freqs_filtered, -versions_filtered,
-partition_offset, -partition_filter_offset; slots under N/<slot variable>;
parts under N/part_<i>), restores through tf.compat.v1.train.Saver after
install_deeprec_api(): every key's row, slot, frequency and version, and the
keys a filter has not admitted. export_deeprec_checkpoint writes that
layout back, read with tf.train.load_variable. A missing, corrupt or
mismatched tensor is refused with an error naming it, and nothing stored
changes.
"""
import numpy as np
import pytest
import tensorflow as tf

from sok_ev_reference import graph_session

SAVED_PARTITIONS = 1000
DIM = 4
ADAGRAD_INITIAL = 0.1


@pytest.fixture(scope="module")
def deeprec(sok):
    sok.install_deeprec_api()
    return sok


def _unique_keys(rng, n, key_dtype):
    """n distinct keys, negative ones included."""
    high = 2**31 - 1 if key_dtype == np.int32 else 2**40
    keys = np.unique(rng.integers(-high, high, size=3 * n))
    return rng.permutation(keys)[:n].astype(key_dtype)


def _deeprec_tensors(base, keys, values, freqs, versions, filtered=None):
    """DeepRec's tensors of one saved Embedding Variable: rows grouped by
  key % 1000 (C++'s remainder for these tests' keys is taken as Python's,
  as sok-ev writes them), with the offsets of each group."""
    filtered = filtered or (np.zeros([0], keys.dtype), np.zeros([0],
                                                                np.int64), np.zeros([0], np.int64))

    def grouped(k, *fields):
        order = np.argsort(np.mod(k.astype(np.int64), SAVED_PARTITIONS), kind="stable")
        counts = np.bincount(np.mod(k.astype(np.int64), SAVED_PARTITIONS),
                             minlength=SAVED_PARTITIONS)
        return [f[order] for f in (k,) + fields], np.concatenate([[0], np.cumsum(counts)
                                                                 ]).astype(np.int32)

    (k, v, f, ver), offsets = grouped(keys, values, freqs, versions)
    (kf, ff, vf), filter_offsets = grouped(*filtered)
    return {
        f"{base}-keys": k,
        f"{base}-values": v,
        f"{base}-freqs": f,
        f"{base}-versions": ver,
        f"{base}-keys_filtered": kf,
        f"{base}-freqs_filtered": ff,
        f"{base}-versions_filtered": vf,
        f"{base}-partition_offset": offsets,
        f"{base}-partition_filter_offset": filter_offsets,
    }


def _save_v2(prefix, tensors):
    names = sorted(tensors)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sess.run(
            tf.raw_ops.SaveV2(prefix=prefix,
                              tensor_names=names,
                              shape_and_slices=[""] * len(names),
                              tensors=[tf.constant(tensors[n]) for n in names]))


def _model(deeprec, key_dtype, filter_freq=0):
    """An Embedding Variable 'emb' trained by Adagrad (its slot made), a
  dense variable 'dense', and a train op fed by a placeholder of keys."""
    option = None
    if filter_freq:
        option = deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(
            filter_freq=filter_freq))
    emb = tf.compat.v1.get_embedding_variable("emb",
                                              embedding_dim=DIM,
                                              key_dtype=tf.as_dtype(key_dtype),
                                              initializer=tf.compat.v1.ones_initializer(),
                                              ev_option=option)
    dense = tf.compat.v1.get_variable("dense", shape=[DIM], initializer=tf.ones_initializer())
    ids = tf.compat.v1.placeholder(key_dtype, [None])
    loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, ids) * dense)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.AdagradOptimizer(
        0.1, initial_accumulator_value=ADAGRAD_INITIAL).minimize(loss, global_step=step)
    return emb, dense, ids, train


def _table(sess, emb):
    """{key: (row, accumulator row, frequency, version)} of the table."""
    keys, rows, freqs, versions, names, _ = sess.run(emb.export_full())
    names = [n.decode() for n in names]
    column = 1 + names.index("Adagrad/accumulator") if "Adagrad/accumulator" in names else None
    table = {}
    for i, key in enumerate(keys):
        slot = rows[i, column * DIM:(column + 1) * DIM] if column else None
        table[int(key)] = (rows[i, :DIM], slot, int(freqs[i]), int(versions[i]))
    return table


def _random_checkpoint(rng, key_dtype, n=40, filtered=0):
    keys = _unique_keys(rng, n + filtered, key_dtype)
    data = {
        "keys": keys[:n],
        "values": rng.standard_normal([n, DIM]).astype(np.float32),
        "accumulators": rng.uniform(0.1, 2.0, [n, DIM]).astype(np.float32),
        "freqs": rng.integers(3, 50, n).astype(np.int64),
        "versions": rng.integers(0, 1000, n).astype(np.int64),
        "dense": rng.standard_normal([DIM]).astype(np.float32),
        "dense_accumulator": rng.uniform(0.1, 2.0, [DIM]).astype(np.float32),
    }
    if filtered:
        data["filtered"] = (keys[n:], rng.integers(1, 3, filtered).astype(np.int64),
                            rng.integers(0, 1000, filtered).astype(np.int64))
    return data


def _write_checkpoint(prefix, data, parts=None):
    """The checkpoint DeepRec saves for _model's variables."""
    tensors = {
        "dense": data["dense"],
        "dense/Adagrad": data["dense_accumulator"],
        "global_step": np.int64(7)
    }
    keys = data["keys"]
    part_of = np.mod(keys.astype(np.int64), parts or 1)
    for p in range(parts or 1):
        base = f"emb/part_{p}" if parts else "emb"
        mine = part_of == p
        filtered = None
        if "filtered" in data:
            k, f, v = data["filtered"]
            fmine = np.mod(k.astype(np.int64), parts or 1) == p
            filtered = (k[fmine], f[fmine], v[fmine])
        tensors.update(
            _deeprec_tensors(base, keys[mine], data["values"][mine], data["freqs"][mine],
                             data["versions"][mine], filtered))
        tensors.update(
            _deeprec_tensors(f"{base}/Adagrad", keys[mine], data["accumulators"][mine],
                             data["freqs"][mine], data["versions"][mine], filtered))
    _save_v2(prefix, tensors)
    return tensors


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("parts", [None, 3])
def test_saver_restores_every_field_of_a_deeprec_checkpoint(deeprec, rng, tmp_path, key_dtype,
                                                            parts):
    data = _random_checkpoint(rng, key_dtype)
    prefix = str(tmp_path / "model.ckpt-7")
    _write_checkpoint(prefix, data, parts)
    with graph_session() as sess:
        emb, dense, _, _ = _model(deeprec, key_dtype)
        tf.compat.v1.train.Saver().restore(sess, prefix)
        table = _table(sess, emb)
        assert sorted(table) == sorted(int(k) for k in data["keys"])
        for i, key in enumerate(data["keys"]):
            row, accumulator, freq, version = table[int(key)]
            np.testing.assert_array_equal(row, data["values"][i])
            np.testing.assert_array_equal(accumulator, data["accumulators"][i])
            assert (freq, version) == (data["freqs"][i], data["versions"][i])
        np.testing.assert_array_equal(sess.run(dense), data["dense"])


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_filtered_keys_restore_into_the_filter_and_export_back(deeprec, rng, tmp_path, key_dtype):
    data = _random_checkpoint(rng, key_dtype, filtered=12)
    prefix = str(tmp_path / "deeprec")
    written = _write_checkpoint(prefix, data)
    exported = str(tmp_path / "exported")
    with graph_session() as sess:
        emb, _, ids, train = _model(deeprec, key_dtype, filter_freq=3)
        deeprec.restore_deeprec_checkpoint(prefix, session=sess)
        keys, freqs, _ = data["filtered"]
        assert not set(_table(sess, emb)) & set(int(k) for k in keys)
        deeprec.export_deeprec_checkpoint(exported, session=sess)
        # Each filtered key is admitted once its count reaches filter_freq.
        short = keys[freqs == 2]
        sess.run(train, {ids: short})
        assert set(int(k) for k in short) <= set(_table(sess, emb))
    # The export holds what was restored, in DeepRec's order.
    for field in ("keys", "values", "freqs", "versions", "partition_offset", "keys_filtered",
                  "freqs_filtered", "versions_filtered", "partition_filter_offset"):
        for base in ("emb", "emb/Adagrad"):
            expected = written[f"{base}-{field}"]
            actual = tf.train.load_variable(exported, f"{base}-{field}")
            if field.startswith("partition"):
                np.testing.assert_array_equal(actual, expected, err_msg=f"{base}-{field}")
                continue
            # Within a save partition DeepRec's order is its hash map's.
            group = "keys_filtered" if "filtered" in field else "keys"
            order_a = np.argsort(tf.train.load_variable(exported, f"{base}-{group}"))
            order_e = np.argsort(written[f"{base}-{group}"])
            np.testing.assert_array_equal(actual[order_a],
                                          expected[order_e],
                                          err_msg=f"{base}-{field}")


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_export_writes_the_trained_tables_in_deeprec_layout(deeprec, rng, tmp_path, key_dtype):
    prefix = str(tmp_path / "exported")
    with graph_session() as sess:
        emb, dense, ids, train = _model(deeprec, key_dtype)
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):  # batches with duplicates
            sess.run(train, {ids: rng.integers(-50, 3000, 30).astype(key_dtype)})
        table = _table(sess, emb)
        dense_value = sess.run(dense)
        deeprec.export_deeprec_checkpoint(prefix, session=sess)
    keys = tf.train.load_variable(prefix, "emb-keys")
    assert keys.dtype == key_dtype and sorted(keys.tolist()) == sorted(table)
    partition = np.mod(keys.astype(np.int64), SAVED_PARTITIONS)
    assert np.all(np.diff(partition) >= 0)
    np.testing.assert_array_equal(
        tf.train.load_variable(prefix, "emb-partition_offset"),
        np.concatenate([[0], np.cumsum(np.bincount(partition, minlength=SAVED_PARTITIONS))]))
    for field, index in (("values", 0), ("freqs", 2), ("versions", 3)):
        expected = np.array([table[int(k)][index] for k in keys])
        np.testing.assert_array_equal(tf.train.load_variable(prefix, f"emb-{field}"), expected)
    np.testing.assert_array_equal(tf.train.load_variable(prefix, "emb/Adagrad-values"),
                                  np.array([table[int(k)][1] for k in keys]))
    np.testing.assert_array_equal(tf.train.load_variable(prefix, "emb/Adagrad-keys"), keys)
    np.testing.assert_array_equal(tf.train.load_variable(prefix, "dense"), dense_value)


def test_missing_counts_restore_as_deeprec_restores_them(deeprec, rng, tmp_path):
    """Without freqs or versions DeepRec gives each key frequency 1 (no
  filter) and version -1."""
    data = _random_checkpoint(rng, np.int64)
    tensors = _write_checkpoint(str(tmp_path / "full"), data)
    for base in ("emb", "emb/Adagrad"):
        tensors[f"{base}-freqs"] = np.zeros([0], np.int64)
        del tensors[f"{base}-versions"]
    _save_v2(str(tmp_path / "bare"), tensors)
    with graph_session() as sess:
        emb, _, _, _ = _model(deeprec, np.int64)
        deeprec.restore_deeprec_checkpoint(str(tmp_path / "bare"), session=sess)
        assert {(f, v) for _, _, f, v in _table(sess, emb).values()} == {(1, -1)}


def _corrupt(kind, tensors):
    if kind == "missing values":
        del tensors["emb-values"]
        return "emb-values"
    if kind == "other dim":
        tensors["emb-values"] = np.zeros([len(tensors["emb-keys"]), DIM + 1], np.float32)
        return "emb-values"
    if kind == "int64 keys for an int32 table":
        tensors["emb-keys"] = tensors["emb-keys"].astype(np.int64)
        return "emb-keys"
    if kind == "freqs of another length":
        tensors["emb-freqs"] = tensors["emb-freqs"][1:]
        return "emb-freqs"
    if kind == "corrupt partition_offset":
        tensors["emb-partition_offset"] = tensors["emb-partition_offset"][::-1].copy()
        return "emb-partition_offset"
    if kind == "missing slot":
        del tensors["emb/Adagrad-keys"]
        return "emb/Adagrad-keys"
    if kind == "float64 values":
        tensors["emb-values"] = tensors["emb-values"].astype(np.float64)
        return "emb-values"
    if kind == "dense of another shape":
        tensors["dense"] = np.zeros([DIM + 2], np.float32)
        return "dense"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", [
    "missing values", "other dim", "int64 keys for an int32 table", "freqs of another length",
    "corrupt partition_offset", "missing slot", "float64 values", "dense of another shape"
])
def test_bad_deeprec_checkpoints_are_refused_and_change_nothing(deeprec, rng, tmp_path, kind):
    data = _random_checkpoint(rng, np.int32)
    tensors = _write_checkpoint(str(tmp_path / "good"), data)
    tensor = _corrupt(kind, tensors)
    _save_v2(str(tmp_path / "bad"), tensors)
    with graph_session() as sess:
        emb, dense, ids, train = _model(deeprec, np.int32)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: rng.integers(0, 100, 20).astype(np.int32)})
        before, dense_before = _table(sess, emb), sess.run(dense)
        with pytest.raises(ValueError) as error:
            tf.compat.v1.train.Saver().restore(sess, str(tmp_path / "bad"))
        assert repr(tensor) in str(error.value)
        after = _table(sess, emb)
        assert sorted(after) == sorted(before)
        for key, (row, slot, freq, version) in before.items():
            np.testing.assert_array_equal(after[key][0], row)
            np.testing.assert_array_equal(after[key][1], slot)
            assert after[key][2:] == (freq, version)
        np.testing.assert_array_equal(sess.run(dense), dense_before)
