"""DeepRec's adaptive embedding column (sok_ev/feature_column.py:
categorical_column_with_adaptive_embedding), after
sok_ev.install_deeprec_api(), in a tf.compat.v1 graph.

Pinned down, against a NumPy reference of the documented rule:
* `input_layer(..., adaptive_mask_tensors={key: mask})` reads each id from
  the Embedding Variable where its mask entry is 1 and from row `key mod
  hash_bucket_size` of the static variable where it is 0, combined by the
  column's combiner over all of a sample's ids (empty rows give zeros);
* a key new to the Embedding Variable starts from the static variable's
  initial row `key mod hash_bucket_size`;
* a training step updates the Embedding Variable's rows of the ids marked 1
  and the static rows of the ids marked 0, as SGD on that model does;
* the model zoo's use (every mask entry 1, one id a sample) trains and
  survives a Saver round trip (both variables);
* bad masks and arguments are refused naming the column, before any
  variable exists (or, for what only the run knows, when the step runs).
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

TF1 = tf.compat.v1
BUCKETS, DIM, LR = 7, 4, 0.5


@pytest.fixture(scope="module")
def deeprec(sok):
    sok.install_deeprec_api()
    return TF1


class Reference:
    """The adaptive model in NumPy: a dict table beside the static rows.
  Ids below 0 are dropped (as tf.nn.safe_embedding_lookup_sparse drops them)
  before anything is counted."""

    def __init__(self, static, combiner):
        self.initial, self.static, self.table, self.combiner = static.copy(), static.copy(), {}, \
            combiner

    def _row(self, key, from_table):
        if from_table:
            return self.table.get(key, self.initial[key % BUCKETS])
        return self.static[key % BUCKETS]

    def _scale(self, count):
        return {"sum": 1.0, "mean": 1.0 / count, "sqrtn": 1.0 / np.sqrt(count)}[self.combiner]

    @staticmethod
    def _kept(batch, keys, mask):
        kept = keys >= 0
        counts = np.bincount(batch.indices[kept, 0], minlength=batch.batch_size)
        return counts, zip(batch.indices[kept], keys[kept], np.asarray(mask)[kept])

    def output(self, batch, keys, mask):
        out = np.zeros((batch.batch_size, DIM), np.float64)
        counts, entries = self._kept(batch, keys, mask)
        for (row, _), key, m in entries:
            out[row] += self._row(key, m == 1) * self._scale(counts[row])
        return out

    def sgd_step(self, batch, keys, mask, upstream):
        counts, entries = self._kept(batch, keys, mask)
        table_grads, static_grads = {}, np.zeros_like(self.static)
        for (row, _), key, m in entries:
            grad = upstream[row] * self._scale(counts[row])
            if m == 1:
                table_grads[key] = table_grads.get(key, 0) + grad
            else:
                static_grads[key % BUCKETS] += grad
        for key, grad in table_grads.items():
            self.table[key] = self._row(key, True) - LR * grad
        self.static -= LR * static_grads


def _model(deeprec, id_dtype, combiner, static):
    column = deeprec.feature_column.categorical_column_with_adaptive_embedding(
        "C1", hash_bucket_size=BUCKETS, dtype=tf.as_dtype(id_dtype))
    return deeprec.feature_column.embedding_column(column,
                                                   dimension=DIM,
                                                   combiner=combiner,
                                                   initializer=tf.constant_initializer(static))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("id_dtype", ["string", "int64", "int32"])
def test_each_id_reads_the_table_or_its_static_row_as_its_mask_says_and_trains_there(
        deeprec, rng, id_dtype, combiner):
    batch = ref.random_sparse_batch(rng, 6, 3, lambda n: rng.integers(-20, 40, size=n), np.int64)
    ids = (np.array([f"id{k}".encode() for k in batch.keys], object)
           if id_dtype == "string" else batch.keys.astype(id_dtype))
    keys = ref.deeprec_keys(ids)
    static = ref.random_matrix(rng, BUCKETS, DIM)
    masks = [rng.integers(0, 2, len(keys)) for _ in range(2)]
    masks.append(1 - masks[0])  # ids read from the static rows now read the table
    upstream = rng.normal(size=(batch.batch_size, DIM)).astype(np.float32)
    reference = Reference(static, combiner)
    with tf.Graph().as_default():
        mask = TF1.placeholder(tf.int32, [None])
        features = {"C1": tf.SparseTensor(batch.indices, ids, batch.dense_shape)}
        out = deeprec.feature_column.input_layer(features,
                                                 [_model(deeprec, id_dtype, combiner, static)],
                                                 adaptive_mask_tensors={"C1": mask})
        train = TF1.train.GradientDescentOptimizer(LR).minimize(tf.reduce_sum(out * upstream))
        with TF1.Session() as sess:
            sess.run(TF1.global_variables_initializer())
            for step, m in enumerate(masks):
                np.testing.assert_allclose(sess.run(out, {mask: m}),
                                           reference.output(batch, keys, m),
                                           rtol=1e-5,
                                           atol=1e-6,
                                           err_msg=f"step {step}")
                sess.run(train, {mask: m})
                reference.sgd_step(batch, keys, m, upstream)


def test_the_model_zoos_all_ones_masks_train_and_survive_a_saver_round_trip(deeprec, rng, tmp_path):
    """DeepRec's model zoo passes tf.ones([batch_size], tf.int32) for
  one-id string features read from CSV: every id reads the Embedding
  Variable, whose new keys start from the static rows, which never train;
  an empty string is dropped with its mask entry."""
    batch_size = 8
    values = np.array([[f"v{k}".encode()] for k in rng.integers(0, 5, batch_size)], object)
    values[3, 0] = b""  # an empty feature: its id and its mask entry are dropped
    static = ref.random_matrix(rng, BUCKETS, DIM)
    keys = ref.deeprec_keys(values[:, 0])
    with tf.Graph().as_default():
        column = _model(deeprec, "string", "mean", static)
        out = deeprec.feature_column.input_layer(
            {"C1": tf.constant(values)}, [column],
            adaptive_mask_tensors={"C1": tf.ones([batch_size], tf.int32)})
        train = TF1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(out**2))
        saver = TF1.train.Saver()
        with TF1.Session() as sess:
            sess.run(TF1.global_variables_initializer())
            before = sess.run(out)
            expected = static[keys % BUCKETS]
            expected[3] = 0
            np.testing.assert_allclose(before, expected, rtol=1e-6)
            for _ in range(3):
                sess.run(train)
            trained = sess.run(out)
            static_after = sess.run(TF1.global_variables("input_layer/C1_embedding/hash")[0])
            path = saver.save(sess, str(tmp_path / "model"))
        with TF1.Session() as sess:
            saver.restore(sess, path)
            np.testing.assert_array_equal(sess.run(out), trained)
    assert np.abs(trained - before).max() > 1e-3
    np.testing.assert_array_equal(static_after, static)


def _input_layer(deeprec, column, masks, ids=None):
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 4], tf.int64),
                          [2, 1]) if ids is None else ids
    return deeprec.feature_column.input_layer({
        "C1": ids,
        "w": ids
    }, [column],
                                              adaptive_mask_tensors=masks)


@pytest.mark.parametrize("masks, fragments", [
    (None, ["C1_embedding", "adaptive_mask_tensors['C1']"]),
    ({
        "C2": [1, 1]
    }, ["C1_embedding", "adaptive_mask_tensors['C1']"]),
    ({
        "C1": [1.0, 0.0]
    }, ["C1_embedding", "float32"]),
])
def test_a_missing_or_non_integer_mask_is_refused_before_any_variable(deeprec, masks, fragments):
    with tf.Graph().as_default():
        column = deeprec.feature_column.embedding_column(
            deeprec.feature_column.categorical_column_with_adaptive_embedding("C1",
                                                                              10,
                                                                              dtype=tf.int64), DIM)
        with pytest.raises(ValueError) as error:
            _input_layer(deeprec, column, masks)
        assert TF1.global_variables() == []
    assert ref.error_names(error.value, *fragments)


@pytest.mark.parametrize("mask, fragment", [([1, 1, 1], "one entry per id"),
                                            ([1, 2], "only 0 and 1")])
def test_a_mask_of_the_wrong_size_or_values_fails_the_step_naming_the_column(
        deeprec, mask, fragment):
    with tf.Graph().as_default():
        column = deeprec.feature_column.embedding_column(
            deeprec.feature_column.categorical_column_with_adaptive_embedding("C1",
                                                                              10,
                                                                              dtype=tf.int64), DIM)
        fed = TF1.placeholder(tf.int32, [None])  # its size known only at run time
        out = _input_layer(deeprec, column, {"C1": fed})
        with TF1.Session() as sess:
            sess.run(TF1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError) as error:
                sess.run(out, {fed: mask})
    assert ref.error_names(error.value, "C1_embedding", fragment)


@pytest.mark.parametrize("size", [0, -3, 2.5, True, None])
def test_a_hash_bucket_size_that_is_not_a_positive_int_is_refused_naming_it(deeprec, size):
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.categorical_column_with_adaptive_embedding("C9", size)
    assert ref.error_names(error.value, "C9", "hash_bucket_size", repr(size))


def test_weighted_shared_and_keras_uses_are_refused_naming_the_column(deeprec):
    adaptive = deeprec.feature_column.categorical_column_with_adaptive_embedding("C1",
                                                                                 10,
                                                                                 dtype=tf.int64)
    with tf.Graph().as_default():
        weighted = deeprec.feature_column.embedding_column(
            deeprec.feature_column.weighted_categorical_column(adaptive, "w"), DIM)
        with pytest.raises(ValueError) as error:
            _input_layer(deeprec,
                         weighted, {"C1": [1, 1]},
                         ids=tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 4], tf.int64),
                                             [2, 1]))
        assert TF1.global_variables() == []
    assert ref.error_names(error.value, "C1", "weights")
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.shared_embedding_columns([adaptive], DIM)
    assert ref.error_names(error.value, "C1", "adaptive")
    column = deeprec.feature_column.embedding_column(adaptive, DIM)
    with tf.Graph().as_default(), pytest.raises(ValueError) as error:
        column._get_dense_tensor(None)  # pylint: disable=protected-access
    assert ref.error_names(error.value, "C1_embedding", "adaptive_mask_tensors")
