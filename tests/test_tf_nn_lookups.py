"""tf.nn.embedding_lookup, tf.nn.embedding_lookup_sparse and
tf.nn.safe_embedding_lookup_sparse (and their tf.compat.v1 forms) read
Embedding Variables, as DeepRec code does.

Reference: the same TensorFlow call on a dense tf.Variable(M), where the
Embedding Variable starts key k at M[k] (InitializerOption(default_value_dim=
N) with tf.constant_initializer(M), keys in [0, N)). Outputs and gradients
must match, in eager mode and in a tf.compat.v1 Session, for every combiner,
with and without weights, int32 and int64 keys, duplicate keys and empty
samples. The Embedding Variable's gradient is IndexedSlices keyed by the
unique looked-up keys; densified it must equal the dense variable's.
Looking a key up inserts it (DeepRec's training lookup).
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

N_ROWS, DIM = 24, 5
MODES = ("eager", "graph")


def _run(mode, build):
    """Builds `build()` -> (fetches, fetched after them) and returns their
    numpy values, eagerly or in a Session (two runs, in that order)."""
    if mode == "eager":
        first, second = build()
        to_numpy = lambda t: t.numpy() if hasattr(t, "numpy") else t
        return tf.nest.map_structure(to_numpy, first), tf.nest.map_structure(to_numpy, second)
    with ref.graph_session() as sess:
        first, second = build()
        sess.run(tf.compat.v1.global_variables_initializer())
        return sess.run(first), sess.run(second)


def _graph_gradient(loss, variable):
    """d loss / d variable in graph mode: tf.gradients on the variable's
    handle, the same for a dense and an Embedding Variable."""
    return tf.gradients(loss, [variable.handle])[0]


def _dense_rows(grad, n_rows):
    """A gradient (IndexedSlices or dense) as an [n_rows, dim] array (NumPy)."""
    if hasattr(grad, "indices"):  # IndexedSlices or, from a Session, IndexedSlicesValue
        dense = np.zeros((n_rows, DIM), np.float64)
        np.add.at(dense, np.asarray(grad.indices).astype(np.int64), np.asarray(grad.values))
        return dense
    return np.asarray(grad)


def _compare(mode, sok, rng, unique_name, key_dtype, call, keys):
    """Runs `call(params)` on an Embedding Variable and on a dense variable
    holding the same rows; compares outputs and gradients, and checks that
    the Embedding Variable then holds exactly the unique `keys`."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)

    def build():
        ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
        dense = tf.Variable(matrix)
        out_ev = call(ev)
        out_dense = call(dense)
        # A fixed pseudo-random upstream gradient of the (dynamic) output shape.
        size = tf.size(out_dense)
        upstream = tf.reshape(tf.sin(tf.cast(tf.range(size), tf.float32) * 1.7),
                              tf.shape(out_dense))
        if mode == "eager":
            with tf.GradientTape(persistent=True) as tape:
                loss_ev = tf.reduce_sum(call(ev) * upstream)
                loss_dense = tf.reduce_sum(call(dense) * upstream)
            grad_ev = tape.gradient(loss_ev, ev)
            grad_dense = tape.gradient(loss_dense, dense)
        else:
            grad_ev = _graph_gradient(tf.reduce_sum(out_ev * upstream), ev)
            grad_dense = _graph_gradient(tf.reduce_sum(out_dense * upstream), dense)
        return dict(out_ev=out_ev, out_dense=out_dense, grad_ev=grad_ev,
                    grad_dense=grad_dense), ev.total_count()

    got, count = _run(mode, build)
    np.testing.assert_allclose(got["out_ev"], got["out_dense"], rtol=1e-5, atol=1e-6)
    # The Embedding Variable's gradient is keyed by raw keys, each once.
    grad_keys = np.asarray(got["grad_ev"].indices)
    assert len(np.unique(grad_keys)) == len(grad_keys)
    np.testing.assert_allclose(_dense_rows(got["grad_ev"], N_ROWS),
                               _dense_rows(got["grad_dense"], N_ROWS),
                               rtol=1e-5,
                               atol=1e-5)
    # Every looked-up key was inserted.
    assert count == len(np.unique(np.asarray(keys)))
    return got


def _every_sparse_case(test):
    """Both modes, key dtypes and API versions, every combiner, with and without
    weights."""
    cases = [("mode", MODES), ("key_dtype", ref.KEY_DTYPES), ("combiner", ref.COMBINERS),
             ("use_weights", [False, True]), ("api", ["v2", "v1"])]
    for argument, values in reversed(cases):
        test = pytest.mark.parametrize(argument, values)(test)
    return test


# --------------------------------------------------------------------------- embedding_lookup


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES)
@pytest.mark.parametrize("api", ["v2", "v1"])
@pytest.mark.parametrize("max_norm", [None, 1.5])
def test_tf_nn_embedding_lookup_reads_an_ev_like_a_dense_variable(sok, rng, unique_name, mode,
                                                                  key_dtype, api, max_norm):
    ids = rng.integers(0, N_ROWS, size=(3, 4)).astype(key_dtype)
    ids[1, 2] = ids[0, 0]  # a duplicate
    lookup = tf.nn.embedding_lookup if api == "v2" else tf.compat.v1.nn.embedding_lookup

    def call(params):
        return lookup(params, tf.constant(ids), max_norm=max_norm)

    got = _compare(mode, sok, rng, unique_name, key_dtype, call, ids)
    assert got["out_ev"].shape == (3, 4, DIM)


def test_tf_nn_embedding_lookup_of_ragged_ids_gives_ragged_rows_as_tensorflow(
        sok, rng, unique_name):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ids = tf.ragged.constant([[3, 3, 7], [], [1], [5, 2]], dtype=tf.int64)
    ev = ref.matrix_ev(sok, unique_name(), matrix)

    out = tf.nn.embedding_lookup(ev, ids)

    expected = tf.nn.embedding_lookup(tf.Variable(matrix), ids)  # TensorFlow's own
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_array_equal(out.row_splits.numpy(), expected.row_splits.numpy())
    np.testing.assert_array_equal(out.flat_values.numpy(), expected.flat_values.numpy())


def test_tf_nn_embedding_lookup_of_no_ids_gives_an_empty_result(sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    out = tf.nn.embedding_lookup(ev, tf.zeros([0], tf.int64))
    assert out.shape == (0, DIM)
    assert int(ev.total_count()) == 0


# --------------------------------------------------------------------------- embedding_lookup_sparse


@_every_sparse_case
def test_tf_nn_embedding_lookup_sparse_reads_an_ev_like_a_dense_variable(
        sok, rng, unique_name, mode, key_dtype, combiner, use_weights, api):
    # Duplicates within a sample, an empty sample inside and an empty last
    # sample (TensorFlow drops trailing empty samples from the result).
    batch = ref.random_sparse_batch(rng, 7, 4, lambda n: rng.integers(0, N_ROWS, size=n), key_dtype)
    lookup = (tf.nn.embedding_lookup_sparse
              if api == "v2" else tf.compat.v1.nn.embedding_lookup_sparse)

    def call(params):
        weights = batch.sp_weights() if use_weights else None
        return lookup(params, batch.sp_ids(), weights, combiner=combiner)

    got = _compare(mode, sok, rng, unique_name, key_dtype, call, batch.keys)
    assert got["out_ev"].shape == (batch.indices[-1, 0] + 1, DIM)


@pytest.mark.parametrize("combiner", ref.COMBINERS)
def test_tf_nn_embedding_lookup_sparse_with_max_norm_clips_rows_before_combining(
        sok, rng, unique_name, combiner):
    batch = ref.random_sparse_batch(rng, 6, 3, lambda n: rng.integers(0, N_ROWS, size=n), np.int64)

    def call(params):
        return tf.nn.embedding_lookup_sparse(params,
                                             batch.sp_ids(),
                                             batch.sp_weights(),
                                             combiner=combiner,
                                             max_norm=0.8)

    _compare("eager", sok, rng, unique_name, np.int64, call, batch.keys)


def test_tf_nn_embedding_lookup_sparse_takes_ragged_ids(sok, rng, unique_name):
    rows = [[3, 3, 7], [], [1], [5, 2]]

    def call(params):
        ids = tf.ragged.constant(rows, dtype=tf.int64)
        return tf.nn.embedding_lookup_sparse(params, ids, None, combiner="mean")

    _compare("eager", sok, rng, unique_name, np.int64, call, sum(rows, []))


# --------------------------------------------------------------------------- safe_embedding_lookup_sparse


def _safe_batch(rng, key_dtype, rank):
    """(indices, keys, weights, dense_shape) with invalid ids (< 0), a zero
    weight, duplicates and empty entries; rank 3 ids have a [d0, d1, hotness]
    shape."""
    batch = ref.random_sparse_batch(rng, 8, 4, lambda n: rng.integers(0, N_ROWS, size=n), key_dtype)
    keys = batch.keys.copy()
    weights = batch.weights.copy()
    keys[2] = -3  # dropped
    weights[3] = 0.0  # dropped unless combiner is 'sum'
    indices, shape = batch.indices, batch.dense_shape
    if rank == 3:  # samples 0..7 -> [4, 2] entries
        indices = np.stack([indices[:, 0] // 2, indices[:, 0] % 2, indices[:, 1]], axis=1)
        shape = [4, 2, batch.max_hotness]
    return indices, keys, weights, shape


@_every_sparse_case
def test_tf_nn_safe_embedding_lookup_sparse_reads_an_ev_like_a_dense_variable(
        sok, rng, unique_name, mode, key_dtype, combiner, use_weights, api):
    indices, keys, weights, shape = _safe_batch(rng, key_dtype, rank=2)
    valid = keys >= 0
    if use_weights and combiner != "sum":
        valid &= weights > 0
    lookup = (tf.nn.safe_embedding_lookup_sparse
              if api == "v2" else tf.compat.v1.nn.safe_embedding_lookup_sparse)

    def call(params):
        sp_weights = tf.SparseTensor(indices, weights, shape) if use_weights else None
        return lookup(params, tf.SparseTensor(indices, keys, shape), sp_weights, combiner=combiner)

    got = _compare(mode, sok, rng, unique_name, key_dtype, call, keys[valid])
    assert got["out_ev"].shape == (8, DIM)  # every sample, empty ones give zeros


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("use_weights", [False, True], ids=["unweighted", "weighted"])
def test_tf_nn_safe_embedding_lookup_sparse_takes_entries_out_of_order_as_tensorflow(
        sok, rng, unique_name, mode, use_weights):
    # TensorFlow's safe lookup accepts any entry order (it sorts them); only
    # the non-safe embedding_lookup_sparse requires canonical order.
    indices, keys, weights, shape = _safe_batch(rng, np.int64, rank=2)
    shuffle = rng.permutation(len(keys))
    indices, keys, weights = indices[shuffle], keys[shuffle], weights[shuffle]

    def call(params):
        sp_weights = tf.SparseTensor(indices, weights, shape) if use_weights else None
        return tf.nn.safe_embedding_lookup_sparse(params,
                                                  tf.SparseTensor(indices, keys, shape),
                                                  sp_weights,
                                                  combiner="mean")

    valid = (keys >= 0) & ((weights > 0) if use_weights else True)
    _compare(mode, sok, rng, unique_name, np.int64, call, keys[valid])


@pytest.mark.parametrize("default_id", [None, 4])
def test_tf_nn_safe_embedding_lookup_sparse_of_rank_3_ids_with_default_id(
        sok, rng, unique_name, default_id):
    indices, keys, weights, shape = _safe_batch(rng, np.int64, rank=3)
    valid_keys = keys[keys >= 0]
    if default_id is not None:
        valid_keys = np.append(valid_keys, default_id)

    def call(params):
        return tf.nn.safe_embedding_lookup_sparse(params,
                                                  tf.SparseTensor(indices, keys, shape),
                                                  tf.SparseTensor(indices, weights, shape),
                                                  combiner="sum",
                                                  default_id=default_id)

    got = _compare("eager", sok, rng, unique_name, np.int64, call, valid_keys)
    assert got["out_ev"].shape == (4, 2, DIM)


# --------------------------------------------------------------------------- training through tf.nn


def test_training_through_tf_nn_embedding_lookup_equals_a_dense_variable(sok, rng, unique_name):
    """DeepRec's example: tf.nn.embedding_lookup + a stock optimizer in a Session."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = [rng.integers(0, N_ROWS, size=6) for _ in range(3)]
    results = {}
    for kind in ("ev", "dense"):
        with ref.graph_session() as sess:
            if kind == "ev":
                table = ref.matrix_ev(sok, unique_name(), matrix)
            else:
                table = tf.compat.v1.get_variable("dense", initializer=matrix, use_resource=True)
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) * 2.0)
            train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in batches:
                sess.run(train, {ids: batch})
            if kind == "ev":
                keys, rows = sess.run(table.export())
                results[kind] = ref.export_to_dict(keys, rows)
            else:
                results[kind] = sess.run(table)
    touched = np.unique(np.concatenate(batches))
    ref.assert_rows_close(results["ev"], {int(k): results["dense"][k] for k in touched},
                          rtol=1e-6,
                          atol=1e-6,
                          what="after 3 Adagrad steps")


# --------------------------------------------------------------------------- errors and dispatch


def test_tf_nn_lookup_of_int64_ids_into_an_int32_ev_names_both_dtypes(sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM, key_dtype=tf.int32)
    with pytest.raises(TypeError) as error:
        tf.nn.embedding_lookup(ev, tf.constant([1, 2], tf.int64))
    assert ref.error_names(error.value, "int64", "int32", "ids")


def test_tf_nn_lookup_over_several_evs_reads_them_as_deeprecs_parts(sok, unique_name):
    """As DeepRec reads a partitioned Embedding Variable: key k, unchanged,
  from evs[(k mod 1000) mod 2] (tests/test_partitioned_variable.py has the
  rest)."""
    evs = [
        sok.get_embedding_variable(unique_name(),
                                   embedding_dim=DIM,
                                   initializer=tf.constant_initializer(float(i))) for i in range(2)
    ]
    keys = np.array([1, 2, 7, -3, 1001], np.int64)
    part = np.mod(np.mod(keys, 1000), 2)
    rows = tf.nn.embedding_lookup(evs, tf.constant(keys)).numpy()
    np.testing.assert_array_equal(rows, np.repeat(part[:, None], DIM, 1))
    for p, ev in enumerate(evs):
        np.testing.assert_array_equal(np.sort(ev.export()[0].numpy()), np.sort(keys[part == p]))


def test_tf_nn_lookup_sparse_refuses_an_unknown_combiner(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    batch = ref.random_sparse_batch(rng, 4, 2, lambda n: rng.integers(0, 9, size=n), np.int64)
    with pytest.raises(ValueError) as error:
        tf.nn.embedding_lookup_sparse(ev, batch.sp_ids(), None, combiner="max")
    assert ref.error_names(error.value, "combiner", "max")


def test_tensorflow_provides_the_dispatch_sok_ev_registers_with():
    # sok_ev.dispatch registers Embedding Variables as a dispatchable type,
    # then uses tf.experimental.dispatch_for_api on the six lookups.
    from tensorflow.python.util import dispatch  # pylint: disable=import-outside-toplevel
    assert callable(dispatch.register_dispatchable_type)
    for api in (tf.nn.embedding_lookup, tf.compat.v1.nn.embedding_lookup,
                tf.nn.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse,
                tf.nn.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse):
        assert api in dispatch.apis_with_type_based_dispatch(), api
