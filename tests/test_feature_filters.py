"""Feature admission: DeepRec's CounterFilter and CBFFilter.

A key is admitted into the trainable table once it has been seen
`filter_freq` times. Before that a lookup reads
`InitializerOption.default_value_no_permission` (0 by default) and its
gradient is dropped; the step that sees a key for the filter_freq-th time
still reads the default value and trains the key's new row (its initial
value). These tests replay DeepRec's own filter tests
(embedding_variable_ops_test.py: testEmbeddingVariableForFeatureFilter*,
testEmbeddingVariableForBloomFilterInt*) with the rows they only compare to
1.0 computed exactly by NumPy SGD, and DeepRec's documented checkpoint
behaviour: every key's id and frequency are saved, admitted or not, the
values of keys not admitted are not, and after a restore training goes on
exactly as if it had never stopped. Run by tests/gpu/run_on_device.sh, the
same tests exercise the GPU tables.
"""
import math

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref
from sok_ev_reference import graph_session

DIM = 3
LEARNING_RATE = 0.1
# DeepRec's testEmbeddingVariableForFeatureFilterFromContribFeatureColumn:
# ten samples of one key each.
DEEPREC_IDS = [1, 1, 1, 1, 2, 2, 2, 3, 3, 4]


def _filtered_ev(sok, name, filter_option, key_dtype=tf.int64, no_permission=0.0):
    option = sok.EmbeddingVariableOption(
        filter_option=filter_option,
        init_option=sok.InitializerOption(default_value_no_permission=no_permission))
    return sok.get_embedding_variable(name,
                                      embedding_dim=DIM,
                                      key_dtype=key_dtype,
                                      initializer=tf.compat.v1.ones_initializer(),
                                      ev_option=option)


def _sgd_graph(sok, ev, ids, key_dtype=tf.int64):
    """DeepRec's test model: loss = sum(2 * embedding_lookup(ev, ids)), SGD."""
    emb = tf.nn.embedding_lookup(ev, tf.constant(ids, key_dtype))
    loss = tf.reduce_sum(emb * 2.0)
    train = tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return emb, train


class AdmissionReference:
    """NumPy replay of the admission rule on one batch of ids per step:
  what each lookup reads, and the rows and frequencies SGD leaves."""

    def __init__(self, filter_freq, no_permission=0.0):
        self.filter_freq = filter_freq
        self.no_permission = no_permission
        self.seen = {}  # occurrences so far, admitted or not
        self.rows = {}  # admitted keys

    def step(self, ids):
        read = []
        for key in ids:
            if key in self.rows:
                read.append(self.rows[key].copy())
            elif self.seen.get(key, 0) >= self.filter_freq:
                read.append(np.ones(DIM, np.float32))  # admitted at this lookup
            else:
                read.append(np.full(DIM, self.no_permission, np.float32))
        counts = {key: ids.count(key) for key in dict.fromkeys(ids)}
        for key, count in counts.items():
            self.seen[key] = self.seen.get(key, 0) + count
        for key, count in counts.items():
            if key not in self.rows and self.seen[key] >= self.filter_freq:
                self.rows[key] = np.ones(DIM, np.float32)
            if key in self.rows:  # d loss / d row = 2 per occurrence
                self.rows[key] = self.rows[key] - np.float32(LEARNING_RATE) * np.float32(2 * count)
        return np.stack(read)


def _table(sess, ev):
    keys, rows, frequencies, _, _, _ = sess.run(ev.export_full())
    return {int(k): (rows[i, :DIM], int(frequencies[i])) for i, k in enumerate(keys)}


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_counter_filter_admits_keys_seen_filter_freq_times_as_deeprec_does(
        sok, unique_name, key_dtype):
    with graph_session() as sess:
        ev = _filtered_ev(sok, unique_name(), sok.CounterFilter(filter_freq=3), key_dtype)
        emb, train = _sgd_graph(sok, ev, DEEPREC_IDS, key_dtype)
        sess.run(tf.compat.v1.global_variables_initializer())
        reference = AdmissionReference(3)
        for step in range(4):
            read, _ = sess.run([emb, train])
            np.testing.assert_array_equal(read, reference.step(DEEPREC_IDS), err_msg=f"step {step}")
            if step == 0:  # DeepRec's assertions: all 0, then keys 1, 2 trained
                assert not read.any()
            table = _table(sess, ev)
            assert table.keys() == reference.rows.keys(), f"step {step}"
            for key, (row, frequency) in table.items():
                np.testing.assert_array_equal(row, reference.rows[key])
                assert frequency == reference.seen[key], f"frequency of key {key}"
    # Keys 1 and 2 (4 and 3 occurrences a step) train from step 1, key 3 (2)
    # from step 2, key 4 (1) from step 3.
    assert set(reference.rows) == {1, 2, 3, 4}


def test_keys_not_admitted_read_default_value_no_permission(sok, unique_name):
    with graph_session() as sess:
        ev = _filtered_ev(sok, unique_name(), sok.CounterFilter(5), no_permission=0.25)
        emb, train = _sgd_graph(sok, ev, [7, 8, 8])
        sess.run(tf.compat.v1.global_variables_initializer())
        read, _ = sess.run([emb, train])
        np.testing.assert_array_equal(read, np.full((3, DIM), 0.25, np.float32))
        # sparse_read counts nothing and inserts nothing.
        np.testing.assert_array_equal(sess.run(ev.sparse_read(tf.constant([7], tf.int64))),
                                      np.full((1, DIM), 0.25, np.float32))
        assert sess.run(ev.total_count()) == 0


@pytest.mark.parametrize("counter_type", [tf.uint8, tf.uint16, tf.uint32, tf.uint64])
@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_cbf_filter_admits_a_key_at_its_filter_freq_th_occurrence_as_deeprec_does(
        sok, unique_name, counter_type, key_dtype):
    """DeepRec's testEmbeddingVariableForBloomFilterInt*: one key per step,
  filter_freq 3: three steps read 0, the fourth the trained row."""
    with graph_session() as sess:
        ev = _filtered_ev(sok,
                          unique_name(),
                          sok.CBFFilter(filter_freq=3,
                                        max_element_size=5,
                                        false_positive_probability=0.01,
                                        counter_type=counter_type),
                          key_dtype=key_dtype)
        emb, train = _sgd_graph(sok, ev, [1], key_dtype)
        sess.run(tf.compat.v1.global_variables_initializer())
        reads = [sess.run([emb, train])[0] for _ in range(4)]
    for step in range(3):
        np.testing.assert_array_equal(reads[step], np.zeros((1, DIM), np.float32))
    # Admitted at step 2's update (its 3rd occurrence): ones, one SGD step.
    np.testing.assert_allclose(reads[3], np.full((1, DIM), 1.0 - LEARNING_RATE * 2, np.float32))


def test_cbf_filter_never_admits_a_key_later_than_counter_filter(sok, rng, unique_name):
    """A counting Bloom filter over-counts (collisions), never under-counts."""
    ids = [int(k) for k in rng.integers(0, 60, 40)]
    reads = {}
    for kind, option in (("exact", sok.CounterFilter(4)),
                         ("bloom",
                          sok.CBFFilter(4, max_element_size=8, false_positive_probability=0.5))):
        with graph_session() as sess:
            ev = _filtered_ev(sok, unique_name(), option)
            emb, train = _sgd_graph(sok, ev, ids)
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            reads[kind] = set(_table(sess, ev))
    assert reads["exact"] <= reads["bloom"]


def test_cbf_filter_size_follows_the_bloom_filter_formula(sok):
    attributes = sok.options.filter_attributes(
        sok.EmbeddingVariableOption(filter_option=sok.CBFFilter(3, 1000, 0.01, tf.uint16)), "t")
    counters = math.ceil(-1000 * math.log(0.01) / math.log(2)**2)
    assert attributes["filter_counters"] == counters == 9586
    assert attributes["filter_hashes"] == round(counters / 1000 * math.log(2)) == 7
    assert attributes["filter_counter_bytes"] == 2


@pytest.mark.parametrize("option, fragments", [
    (lambda sok: sok.CounterFilter(filter_freq=-1), ["filter_freq", "-1"]),
    (lambda sok: sok.CBFFilter(3, 5, 0.01, counter_type=tf.float32), ["counter_type", "float32"]),
])
def test_bad_filter_options_are_refused_naming_the_argument(sok, unique_name, option, fragments):
    with graph_session():
        with pytest.raises(ValueError) as error:
            _filtered_ev(sok, unique_name(), option(sok))
        assert ref.error_names(error.value, *fragments)


# --------------------------------------------------------------------------- checkpoints


def _train_saved_resumed(sok, unique_name, tmp_path, option, steps_before, steps_after, ids):
    """Trains `steps_before` steps, saves, trains on; then restores the save
  into a fresh graph and session and trains the same steps after it.
  Returns (checkpoint path, uninterrupted reads and table, resumed ones)."""
    name = unique_name()
    path = str(tmp_path / "model.ckpt")
    runs = []
    for resumed in (False, True):
        with graph_session() as sess:
            ev = _filtered_ev(sok, name, option)
            emb, train = _sgd_graph(sok, ev, ids)
            saver = tf.compat.v1.train.Saver()
            if resumed:
                saver.restore(sess, path)
            else:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(steps_before):
                    sess.run(train)
                saver.save(sess, path)
            reads = [sess.run([emb, train])[0] for _ in range(steps_after)]
            runs.append((reads, sess.run(ev.export_full()[:4])))
    return path, name, runs[0], runs[1]


def test_counter_filter_counts_of_keys_not_admitted_survive_a_checkpoint(
        sok, unique_name, tmp_path):
    path, name, uninterrupted, resumed = _train_saved_resumed(sok, unique_name, tmp_path,
                                                              sok.CounterFilter(3), 1, 3,
                                                              DEEPREC_IDS)
    # DeepRec's checkpoint: admitted keys with their rows and frequencies,
    # keys not admitted (3: seen twice, 4: once) with frequencies only.
    shard = f"{name}/sok_ev/shard_0_of_1"
    np.testing.assert_array_equal(np.sort(tf.train.load_variable(path, f"{shard}/keys")), [1, 2])
    filtered = tf.train.load_variable(path, f"{shard}/keys_filtered")
    frequencies = tf.train.load_variable(path, f"{shard}/frequencies_filtered")
    assert dict(zip(filtered.tolist(), frequencies.tolist())) == {3: 2, 4: 1}
    versions = tf.train.load_variable(path, f"{shard}/versions_filtered")
    assert versions.tolist() == [0, 0]  # the step of the update that dropped them
    for step, (a, b) in enumerate(zip(uninterrupted[0], resumed[0])):
        np.testing.assert_array_equal(b, a, err_msg=f"read after the restore, step {step}")
    for a, b in zip(uninterrupted[1], resumed[1]):
        order_a, order_b = np.argsort(uninterrupted[1][0]), np.argsort(resumed[1][0])
        np.testing.assert_array_equal(np.asarray(b)[order_b], np.asarray(a)[order_a])


def test_cbf_filter_counters_survive_a_checkpoint(sok, unique_name, tmp_path):
    option = sok.CBFFilter(3,
                           max_element_size=5,
                           false_positive_probability=0.01,
                           counter_type=tf.uint8)
    path, name, uninterrupted, resumed = _train_saved_resumed(sok, unique_name, tmp_path, option, 2,
                                                              2, [1])
    counters = tf.train.load_variable(path, f"{name}/sok_ev/shard_0_of_1/bloom_counters")
    assert counters.dtype == np.uint8 and counters.shape == (48,)
    # Key 1 seen twice: each of its 7 hashes (round(48 / 5 * ln 2)) added 1
    # twice, to a counter that stops at filter_freq (two hashes may share one).
    assert set(counters[counters > 0].tolist()) <= {2, 3} and 2 in counters
    assert 1 <= np.count_nonzero(counters) <= 7
    # The third occurrence (first step after the restore) admits the key.
    np.testing.assert_array_equal(resumed[0][0], np.zeros((1, DIM), np.float32))
    np.testing.assert_array_equal(resumed[0][1], uninterrupted[0][1])
    np.testing.assert_allclose(resumed[0][1], np.full((1, DIM), 0.8, np.float32))
