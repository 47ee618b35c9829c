"""A grouped lookup gives the same bits whether its tables run side by side
on GPU side streams or one after another on TensorFlow's stream.

On a GPU, lookup_sparse's grouped ops (FindOrInsertCombine, FindOrInsert,
CombineForward, CombineBackward) spread their tables over side streams
(SOK_EV_GPU_TABLE_STREAMS, default 4, read at each op; see
sok_ev/cc/kernels/side_streams_gpu.h). A table's work is independent of
the others', so the outputs, the gradients' effect and every stored row,
slot and frequency must not change with the setting, bit for bit. The
same Embedding Variable listed twice in one lookup puts two tables on one
hash table: their inserts must stay in order (they share a stream), or a
key both insert could get two rows.

The first step's outputs are also pinned to tf.nn.embedding_lookup_sparse
on a dense table of the same initial rows. On the CPU the setting has no
effect, and these tests pin the CPU path to the same references.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

N_ROWS, DIM, BATCH, MAX_HOTNESS, STEPS = 40, 8, 24, 5, 3
# Seven tables over four variables: variable 0 three times, variable 2 twice.
VARIABLE_OF_TABLE = [0, 1, 0, 2, 3, 2, 0]
COMBINERS = ["sum", "mean", "sqrtn", "sum", "mean", "sum", "sqrtn"]
WEIGHTED = [False, True, False, True, False, False, True]
STREAM_SETTINGS = ["1", "4", "16"]


def _draw(rng, key_dtype):
    steps = []
    for _ in range(STEPS):
        batches = [
            ref.random_sparse_batch(rng, BATCH, MAX_HOTNESS,
                                    ref.key_sampler(rng, "beyond_n", N_ROWS, key_dtype), key_dtype)
            for _ in VARIABLE_OF_TABLE
        ]
        upstreams = [rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in VARIABLE_OF_TABLE]
        steps.append((batches, upstreams))
    return steps


def _variables(sok, matrix, key_dtype, prefix):
    return [
        ref.matrix_ev(sok, f"{prefix}_v{v}", matrix, key_dtype=key_dtype)
        for v in range(max(VARIABLE_OF_TABLE) + 1)
    ]


def _weights(batch, t):
    return batch.sp_weights() if WEIGHTED[t] else None


def _train(sok, mode, matrix, key_dtype, steps, prefix):
    """Each step: the grouped lookup, loss sum(out_t * upstream_t), Adagrad.
    Returns ([outputs of each step], [export_full of each variable])."""
    outputs = []
    if mode == "graph":
        with ref.graph_session() as sess:
            variables = _variables(sok, matrix, key_dtype, prefix)
            params = [variables[v] for v in VARIABLE_OF_TABLE]
            ids = [
                tf.compat.v1.sparse_placeholder(tf.as_dtype(key_dtype), shape=[None, None])
                for _ in params
            ]
            weights = [
                tf.compat.v1.sparse_placeholder(tf.float32, shape=[None, None])
                if WEIGHTED[t] else None for t in range(len(params))
            ]
            upstreams = [tf.compat.v1.placeholder(tf.float32, [None, DIM]) for _ in params]
            out = sok.lookup_sparse(params, ids, combiners=COMBINERS, sp_weights=weights)
            loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(out, upstreams)])
            train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
            exports = [v.export_full()[:4] for v in variables]
            sess.run(tf.compat.v1.global_variables_initializer())
            for batches, ups in steps:
                feed = {}
                for t, batch in enumerate(batches):
                    feed[ids[t]] = batch.ids_value()
                    feed[upstreams[t]] = ups[t]
                    if WEIGHTED[t]:
                        feed[weights[t]] = tf.compat.v1.SparseTensorValue(
                            batch.indices, batch.weights, batch.dense_shape)
                outputs.append(sess.run([out, train], feed)[0])
            return outputs, sess.run(exports)
    variables = _variables(sok, matrix, key_dtype, prefix)
    params = [variables[v] for v in VARIABLE_OF_TABLE]
    opt = tf.compat.v1.train.AdagradOptimizer(0.1)
    for batches, ups in steps:
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(params, [b.sp_ids() for b in batches],
                                    combiners=COMBINERS,
                                    sp_weights=[_weights(b, t) for t, b in enumerate(batches)])
            loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(out, ups)])
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        outputs.append([o.numpy() for o in out])
    return outputs, [[x.numpy() for x in v.export_full()[:4]] for v in variables]


def _sorted_by_key(export):
    return ref.in_key_order(*export)


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
def test_training_gives_the_same_bits_on_side_streams_as_on_one_stream(
        sok, rng, monkeypatch, mode, key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    steps = _draw(rng, key_dtype)
    runs = {}
    for setting in STREAM_SETTINGS:
        monkeypatch.setenv("SOK_EV_GPU_TABLE_STREAMS", setting)
        runs[setting] = _train(sok, mode, matrix, key_dtype, steps,
                               f"side_{mode}_{np.dtype(key_dtype).name}_{setting}")
    one_outputs, one_exports = runs["1"]
    # The one-stream run against TensorFlow's dense lookup on the first step,
    # before any update (every row is its initial value then).
    for t, batch in enumerate(steps[0][0]):
        expected = ref.reference_lookup(matrix, batch, COMBINERS[t], WEIGHTED[t])
        np.testing.assert_allclose(one_outputs[0][t], expected, rtol=1e-5, atol=1e-5)
    for setting in STREAM_SETTINGS[1:]:
        outputs, exports = runs[setting]
        for step, (got, want) in enumerate(zip(outputs, one_outputs)):
            for t in range(len(VARIABLE_OF_TABLE)):
                np.testing.assert_array_equal(got[t],
                                              want[t],
                                              err_msg=f"{setting} streams, step {step}, table {t}")
        for v, (got, want) in enumerate(zip(exports, one_exports)):
            for name, a, b in zip(("keys", "rows", "frequencies", "versions"), _sorted_by_key(got),
                                  _sorted_by_key(want)):
                np.testing.assert_array_equal(a,
                                              b,
                                              err_msg=f"{setting} streams, variable {v}: {name}")


def test_a_variable_listed_twice_gets_one_row_per_key_on_side_streams(sok, rng, monkeypatch):
    """Two tables of one lookup on the same variable insert the same new keys:
    each key gets one row, counted once per occurrence in both tables."""
    monkeypatch.setenv("SOK_EV_GPU_TABLE_STREAMS", "8")
    variable = sok.get_embedding_variable("side_twice", embedding_dim=DIM)
    others = [
        sok.get_embedding_variable(f"side_twice_other{i}", embedding_dim=DIM) for i in range(3)
    ]
    keys = rng.integers(0, 1 << 40, size=200).astype(np.int64)
    batch = tf.SparseTensor(np.stack([np.arange(200), np.zeros(200, np.int64)], 1), keys, [200, 1])
    params = [variable, others[0], variable, others[1], variable, others[2]]
    out = sok.lookup_sparse(params, [batch] * len(params))
    for o in out[1:]:
        assert o.shape == out[0].shape
    np.testing.assert_array_equal(out[0].numpy(), out[2].numpy())
    np.testing.assert_array_equal(out[0].numpy(), out[4].numpy())
    exported_keys, _, frequencies, _ = _sorted_by_key(variable.export_full()[:4])
    unique, counts = np.unique(keys, return_counts=True)
    np.testing.assert_array_equal(exported_keys, unique)
    np.testing.assert_array_equal(frequencies, 3 * counts)
