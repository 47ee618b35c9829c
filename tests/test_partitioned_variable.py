"""DeepRec's partitioned Embedding Variables: get_embedding_variable(...,
partitioner=p) gives N parts `<name>/part_<i>`, N being the partitioner's
answer for a [sys.maxsize, embedding_dim] variable, and DeepRec's
tf.nn.embedding_lookup sends key k, unchanged, to part (k mod 1000) mod N.

Reference: TensorFlow's own lookups and optimizers on a dense tf.Variable
M, where every part starts key k at M[k mod R] (InitializerOption(
default_value_dim=R) with tf.constant_initializer(M)), keys in [0, R).
Outputs, gradients (the parts' IndexedSlices summed by key) and trained
rows must match, for int32 and int64 keys, duplicates and empty samples;
each part must hold exactly the keys DeepRec routes to it, negative ones
and ones past 1000 included.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

R, DIM = 60, 4  # matrix rows (keys in [0, R)), embedding_dim


def _partitioned(sok, name, matrix, key_dtype, parts):
    """`parts` parts, each starting key k at matrix[k mod R]."""
    return ref.matrix_ev(sok,
                         name,
                         matrix,
                         key_dtype,
                         partitioner=tf.compat.v1.fixed_size_partitioner(parts))


def _part_of(keys, parts):
    """DeepRec's routing, in NumPy."""
    return np.mod(np.mod(np.asarray(keys, np.int64), 1000), parts)


def _dense_gradient(part_grads):
    """The parts' gradients (IndexedSlices keyed by raw keys) summed into one
  [R, DIM] array."""
    dense = np.zeros((R, DIM), np.float64)
    for grad in part_grads:
        if grad is not None:
            np.add.at(dense, np.asarray(grad.indices).astype(np.int64), np.asarray(grad.values))
    return dense


def _batch(rng, key_dtype):
    return ref.random_sparse_batch(rng, 9, 5, lambda n: rng.integers(0, R, n), key_dtype)


LOOKUPS = {
    "embedding_lookup":
        lambda params, b: tf.nn.embedding_lookup(params, b.keys),
    "embedding_lookup_sparse_mean":
        lambda params, b: tf.nn.embedding_lookup_sparse(params, b.sp_ids(), None, combiner="mean"),
    "embedding_lookup_sparse_weighted_sqrtn":
        lambda params, b: tf.nn.embedding_lookup_sparse(
            params, b.sp_ids(), b.sp_weights(), combiner="sqrtn"),
    "safe_embedding_lookup_sparse_sum":
        lambda params, b: tf.nn.safe_embedding_lookup_sparse(
            params, b.sp_ids(), b.sp_weights(), combiner="sum"),
    "v1_embedding_lookup_max_norm":
        lambda params, b: tf.compat.v1.nn.embedding_lookup(params, b.keys, max_norm=1.5),
}


@pytest.mark.parametrize("parts", [1, 3, 4])
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("call", sorted(LOOKUPS))
def test_a_partitioned_variable_reads_and_differentiates_as_one_dense_table(
        sok, rng, unique_name, parts, key_dtype, call):
    matrix = ref.random_matrix(rng, R, DIM)
    batch = _batch(rng, key_dtype)
    variable = _partitioned(sok, unique_name(), matrix, key_dtype, parts)
    dense = tf.Variable(matrix)
    assert len(variable) == parts and [p.name for p in variable
                                      ] == [f"{variable.name}/part_{i}:0" for i in range(parts)]
    with tf.GradientTape(persistent=True) as tape:
        out, out_dense = (LOOKUPS[call](params, batch) for params in (variable, dense))
        upstream = tf.sin(
            tf.reshape(tf.range(tf.size(out_dense), dtype=tf.float32), tf.shape(out_dense)))
        loss, loss_dense = (tf.reduce_sum(o * upstream) for o in (out, out_dense))
    np.testing.assert_allclose(out.numpy(), out_dense.numpy(), rtol=1e-5, atol=1e-6)
    grads = tape.gradient(loss, list(variable))
    np.testing.assert_allclose(_dense_gradient(grads),
                               np.asarray(tf.convert_to_tensor(tape.gradient(loss_dense, dense))),
                               rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_each_part_holds_the_keys_deeprec_routes_to_it(sok, unique_name, parts):
    keys = np.array([0, 1, 2, 5, 6, 7, -3, -1001, 1000, 1003, 2**40 + 7, 5], np.int64)
    variable = sok.get_embedding_variable(unique_name(),
                                          embedding_dim=3,
                                          initializer=tf.ones_initializer(),
                                          partitioner=tf.compat.v1.fixed_size_partitioner(parts))
    tf.nn.embedding_lookup(variable, keys)
    unique = np.unique(keys)
    for p, part in enumerate(variable):
        np.testing.assert_array_equal(np.sort(part.export()[0].numpy()),
                                      unique[_part_of(unique, parts) == p],
                                      err_msg=p)
    assert int(variable.total_count()) == len(unique)


def test_deeprecs_partitioned_example_trains_as_adagrad_on_one_dense_table(sok, rng):
    """DeepRec's Embedding Variable guide, in a Session: four parts, a
  lookup, AdagradOptimizer over compute_gradients; each step's rows equal
  TensorFlow's Adagrad on the dense reference."""
    parts = 4
    matrix = ref.random_matrix(rng, R, DIM)
    ids = np.array([0, 1, 2, 5, 6, 7, 7, 13, 42], np.int64)
    with ref.graph_session() as sess:
        variable = _partitioned(sok, "var_0", matrix, np.int64, parts)
        dense = tf.compat.v1.get_variable("dense", initializer=matrix)
        counts = [part.total_count() for part in variable]
        steps = []
        for params in (variable, dense):
            emb = tf.nn.embedding_lookup(params, tf.constant(ids))
            loss = tf.reduce_sum(tf.multiply(emb, 2.0) * tf.sin(emb))
            optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
            train = optimizer.apply_gradients(
                optimizer.compute_gradients(
                    loss, var_list=list(params) if params is variable else [dense]))
            steps.append((emb, train))
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(3):
            (got, _), (want, _) = sess.run(steps)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
        assert sess.run(counts) == [
            len(np.unique(ids[_part_of(ids, parts) == p])) for p in range(parts)
        ]


def test_a_saver_saves_and_restores_every_part_under_its_name(sok, rng, tmp_path):
    matrix = ref.random_matrix(rng, R, DIM)
    with ref.graph_session() as sess:
        variable = _partitioned(sok, "table", matrix, np.int64, 3)
        emb = tf.nn.embedding_lookup(variable, tf.constant(np.arange(0, R, 3), tf.int64))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(emb**2))
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        saved = sess.run(emb)
        path = saver.save(sess, str(tmp_path / "model"))
        sess.run(train)
        assert not np.allclose(sess.run(emb), saved)
        saver.restore(sess, path)
        np.testing.assert_array_equal(sess.run(emb), saved)
    names = [name for name, _ in tf.train.list_variables(path)]
    for p in range(3):
        assert any(name.startswith(f"table/part_{p}") for name in names), names


def test_target_gpu_set_on_a_partitioned_variable_sets_every_part(sok, unique_name):
    variable = sok.get_embedding_variable(unique_name(),
                                          embedding_dim=2,
                                          partitioner=tf.compat.v1.fixed_size_partitioner(3))
    variable.target_gpu = 0
    assert variable.target_gpu == 0 and [p.target_gpu for p in variable] == [0, 0, 0]
    with pytest.raises(ValueError) as error:
        variable.target_gpu = -4
    assert ref.error_names(error.value, "target_gpu", -4)
    assert [p.target_gpu for p in variable] == [0, 0, 0]


def test_lookup_sparse_refuses_a_partitioned_variable_naming_it(sok, unique_name):
    variable = sok.get_embedding_variable(unique_name(),
                                          embedding_dim=2,
                                          partitioner=tf.compat.v1.fixed_size_partitioner(2))
    ids = tf.SparseTensor([[0, 0]], tf.constant([3], tf.int64), [1, 1])
    with pytest.raises(TypeError) as error:
        sok.lookup_sparse([variable], [ids])
    assert ref.error_names(error.value, "params[0]", "partitioned", variable.name, "2 parts")
    assert all(int(p.total_count()) == 0 for p in variable)


def test_parts_of_different_shape_are_refused_by_the_lookups(sok, unique_name):
    a = sok.get_embedding_variable(unique_name(), embedding_dim=2)
    b = sok.get_embedding_variable(unique_name(), embedding_dim=3)
    with pytest.raises(ValueError) as error:
        tf.nn.embedding_lookup([a, b], tf.constant([1, 2], tf.int64))
    assert ref.error_names(error.value, "embedding_dim", a.name, b.name)
    assert int(a.total_count()) == int(b.total_count()) == 0


def test_deeprecs_checkpoint_layout_keeps_each_part_under_its_name(sok, rng, tmp_path):
    """export_deeprec_checkpoint writes part i as DeepRec does
  (`table/part_<i>-keys`, the keys routed to it), and restore_deeprec_checkpoint
  reads it back into a partitioned variable of the same parts."""
    matrix = ref.random_matrix(rng, R, DIM)
    ids = np.array([0, 4, 5, 9, 10, 33, 59], np.int64)
    prefix = str(tmp_path / "deeprec")
    rows = []
    for restore in (False, True):
        with ref.graph_session() as sess:
            variable = _partitioned(sok, "table",
                                    np.zeros_like(matrix) if restore else matrix, np.int64, 3)
            emb = tf.nn.embedding_lookup(variable, tf.constant(ids))
            sess.run(tf.compat.v1.global_variables_initializer())
            if restore:
                sok.restore_deeprec_checkpoint(prefix, session=sess)
                rows.append(sess.run(emb))
            else:
                rows.append(sess.run(emb))
                sok.export_deeprec_checkpoint(prefix, session=sess)
    np.testing.assert_array_equal(rows[1], rows[0])
    for p in range(3):
        saved = tf.train.load_variable(prefix, f"table/part_{p}-keys")
        np.testing.assert_array_equal(np.sort(saved), ids[_part_of(ids, 3) == p])


def test_a_saver_refuses_a_checkpoint_holding_more_parts_before_anything_changes(
        sok, rng, tmp_path):
    """Restored into fewer parts, the saved extra parts' keys would be left
  out: Saver.restore refuses, naming the variable, and the table keeps what
  it had."""
    matrix = ref.random_matrix(rng, R, DIM)
    ids = np.arange(0, R, 3).astype(np.int64)
    with ref.graph_session() as sess:
        emb = tf.nn.embedding_lookup(_partitioned(sok, "table", matrix, np.int64, 4),
                                     tf.constant(ids))
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(emb)
        path = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "four"))
    with ref.graph_session() as sess:
        variable = _partitioned(sok, "table", matrix, np.int64, 2)
        emb = tf.nn.embedding_lookup(variable, tf.constant(ids[:2]))
        sess.run(tf.compat.v1.global_variables_initializer())
        before = sess.run(emb)
        with pytest.raises(ValueError) as error:
            tf.compat.v1.train.Saver().restore(sess, path)
        assert ref.error_names(error.value, "table", "2 parts", "table/part_2")
        assert sess.run([p.total_count() for p in variable]) == [1, 1]
        np.testing.assert_array_equal(sess.run(emb), before)


def test_a_deeprec_checkpoint_holding_more_parts_is_refused_naming_it(sok, rng, tmp_path):
    matrix = ref.random_matrix(rng, R, DIM)
    prefix = str(tmp_path / "deeprec")
    with ref.graph_session() as sess:
        emb = tf.nn.embedding_lookup(_partitioned(sok, "table", matrix, np.int64, 3),
                                     tf.constant(np.arange(R), tf.int64))
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(emb)
        sok.export_deeprec_checkpoint(prefix, session=sess)
    with ref.graph_session() as sess:
        variable = _partitioned(sok, "table", matrix, np.int64, 2)
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(ValueError) as error:
            sok.restore_deeprec_checkpoint(prefix, session=sess)
        assert ref.error_names(error.value, "table", "2 parts", "table/part_2")
        assert sess.run([p.total_count() for p in variable]) == [0, 0]
