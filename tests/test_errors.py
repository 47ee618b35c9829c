"""Bad inputs fail early with a clear error naming the argument and the value.

Pinned down for get_embedding_variable (embedding_dim, key_dtype, a
partitioner that cannot split it), target_gpu (set to no integer or below
-1), lookup_sparse (key dtype mismatch, float keys, list lengths, combiner,
SparseTensor rank -- also fed at run time where it was unknown --,
sp_weights whose indices, batch or row splits are not the ids', non-EV or
partitioned params, target_gpu out of range) and the optimizer hook
(unsupported optimizers list the supported ones).
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

# The errors the spec allows for a bad Python-level argument.
ARGUMENT_ERRORS = (ValueError, TypeError)


def _batch(rng, key_dtype=np.int64):
    return ref.random_sparse_batch(rng, 6, 3, lambda n: rng.integers(0, 50, size=n), key_dtype)


# --------------------------------------------------------------------------- creation


@pytest.mark.parametrize("dim", [0, -3])
def test_non_positive_embedding_dim_is_rejected(sok, unique_name, dim):
    with pytest.raises(ValueError) as error:
        sok.get_embedding_variable(unique_name(), embedding_dim=dim)
    assert ref.error_names(error.value, "embedding_dim", dim)


@pytest.mark.parametrize("key_dtype", [tf.float32, tf.string, tf.int16, tf.uint64])
def test_key_dtype_other_than_int32_or_int64_is_rejected(sok, unique_name, key_dtype):
    with pytest.raises(ARGUMENT_ERRORS) as error:
        sok.get_embedding_variable(unique_name(), embedding_dim=4, key_dtype=key_dtype)
    assert ref.error_names(error.value, "key_dtype", key_dtype.name)


@pytest.mark.parametrize("partitioner", [
    tf.compat.v1.fixed_size_partitioner(2, axis=1),
    tf.compat.v1.fixed_size_partitioner(5000), "4"
],
                         ids=["along_axis_1", "5000_parts", "not_callable"])
def test_a_partitioner_that_cannot_split_an_embedding_variable_is_rejected(
        sok, unique_name, partitioner):
    with pytest.raises(ValueError) as error:
        sok.get_embedding_variable(unique_name(), embedding_dim=4, partitioner=partitioner)
    assert ref.error_names(error.value, "partitioner")


# --------------------------------------------------------------------------- lookup arguments


def test_int64_keys_into_int32_ev_are_rejected(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4, key_dtype=tf.int32)
    with pytest.raises(ARGUMENT_ERRORS) as error:
        sok.lookup_sparse([ev], [_batch(rng, np.int64).sp_ids()], combiners=["sum"])
    assert ref.error_names(error.value, "int64", "int32")


def test_int32_keys_into_int64_ev_are_rejected(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4, key_dtype=tf.int64)
    with pytest.raises(ARGUMENT_ERRORS) as error:
        sok.lookup_sparse([ev], [_batch(rng, np.int32).sp_ids()], combiners=["sum"])
    assert ref.error_names(error.value, "int64", "int32")


def test_float_keys_are_rejected(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    batch = _batch(rng)
    float_ids = tf.SparseTensor(batch.indices, batch.keys.astype(np.float32), batch.dense_shape)
    with pytest.raises(ARGUMENT_ERRORS) as error:
        sok.lookup_sparse([ev], [float_ids], combiners=["sum"])
    assert ref.error_names(error.value, "float32")


@pytest.mark.parametrize("wrong_list", ["indices", "combiners", "sp_weights"])
def test_lists_of_different_lengths_are_rejected(sok, rng, unique_name, wrong_list):
    # Two tables; the named list has three entries instead of two.
    evs = [sok.get_embedding_variable(unique_name(), embedding_dim=4) for _ in range(2)]
    batch = _batch(rng)
    lengths = {"indices": 2, "combiners": 2, "sp_weights": 2, wrong_list: 3}
    with pytest.raises(ValueError) as error:
        sok.lookup_sparse(evs, [batch.sp_ids()] * lengths["indices"],
                          combiners=["sum"] * lengths["combiners"],
                          sp_weights=[batch.sp_weights()] * lengths["sp_weights"])
    assert ref.error_names(error.value, wrong_list, "2", "3")  # the list and both lengths


def test_unknown_combiner_is_rejected(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    with pytest.raises(ValueError) as error:
        sok.lookup_sparse([ev], [_batch(rng).sp_ids()], combiners=["max"])
    assert ref.error_names(error.value, "combiner", "max")


@pytest.mark.parametrize("rank", [1, 3])
def test_sparse_tensor_of_rank_other_than_2_is_rejected(sok, unique_name, rank):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    indices = np.zeros((3, rank), np.int64)
    indices[:, 0] = [0, 1, 2]
    sp = tf.SparseTensor(indices, tf.constant([1, 2, 3], tf.int64), [3] + [2] * (rank - 1))
    with pytest.raises(ValueError) as error:
        sok.lookup_sparse([ev], [sp], combiners=["sum"])
    assert ref.error_names(error.value, "rank", rank)


def test_dense_variable_in_params_is_rejected(sok, rng):
    dense = tf.Variable(np.zeros((50, 4), np.float32), name="dense_table")
    with pytest.raises(ARGUMENT_ERRORS) as error:
        sok.lookup_sparse([dense], [_batch(rng).sp_ids()], combiners=["sum"])
    assert ref.error_names(error.value, "params")


@pytest.mark.parametrize("target_gpu", [1, 5, -2])
def test_target_gpu_out_of_range_is_rejected_at_lookup(sok, rng, unique_name, target_gpu):
    # One worker without Horovod: world size 1, so only -1 (local) and 0 are valid.
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as error:
        ev.target_gpu = target_gpu  # below -1: refused at once
        out = sok.lookup_sparse([ev], [_batch(rng).sp_ids()], combiners=["sum"])
        out[0].numpy()
    assert ref.error_names(error.value, "target_gpu", target_gpu)


@pytest.mark.parametrize("value", ["x", 1.5, None, True, "0"])
def test_a_target_gpu_that_is_no_integer_is_refused_at_once_naming_it_and_the_value(
        sok, unique_name, value):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    with pytest.raises(TypeError) as error:
        ev.target_gpu = value
    assert ref.error_names(error.value, "target_gpu", repr(value), ev.name.split(":")[0])
    assert ev.target_gpu == -1  # unchanged


def test_a_rank_3_sparse_tensor_fed_where_the_rank_was_unknown_is_refused_inserting_nothing(sok):
    with ref.graph_session() as sess:
        ev = sok.get_embedding_variable("emb", embedding_dim=4)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)  # no shape: rank unknown when built
        out = sok.lookup_sparse([ev], [ids], combiners=["sum"])[0]
        keys, _ = ev.export()
        sess.run(tf.compat.v1.global_variables_initializer())
        rank_3 = tf.compat.v1.SparseTensorValue([[0, 0, 0], [0, 1, 0], [1, 0, 1]], [1, 2, 3],
                                                [2, 2, 2])
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            sess.run(out, {ids: rank_3})
        assert ref.error_names(error.value, "indices[0]", "rank 2", "got rank 3")
        assert sess.run(keys).size == 0
        # The same lookup still takes a rank-2 batch.
        rank_2 = tf.compat.v1.SparseTensorValue([[0, 0], [1, 0]], [1, 2], [2, 1])
        assert sess.run(out, {ids: rank_2}).shape == (2, 4)


def _shifted_weights(batch):
    """Weights with batch's shape and number of entries, but the last entry
    at another index (the next position of the first sample)."""
    indices = batch.indices.copy()
    indices[-1] = [0, batch.max_hotness - 1]
    order = np.lexsort((indices[:, 1], indices[:, 0]))
    return tf.SparseTensor(indices[order], batch.weights[order], batch.dense_shape)


def test_eager_sp_weights_with_other_indices_are_refused_inserting_nothing(sok, rng, unique_name):
    batch = _batch(rng)
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    with pytest.raises(ValueError) as error:
        sok.lookup_sparse([ev], [batch.sp_ids()],
                          combiners=["sum"],
                          sp_weights=[_shifted_weights(batch)])
    assert ref.error_names(error.value, "sp_weights[0]", "indices[0]", "indices")
    assert ev.export()[0].numpy().size == 0


def test_eager_packed_sp_weights_of_other_row_splits_are_refused_inserting_nothing(
        sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    ids = tf.ragged.constant([[[1, 2], [3]]], tf.int64)  # [1 table, 2 samples, None]
    weights = tf.ragged.constant([[[0.5], [2.0, 3.0]]])  # as many, split elsewhere
    with pytest.raises(ValueError) as error:
        sok.lookup_sparse([ev], ids, "sum", sp_weights=weights)
    assert ref.error_names(error.value, "sp_weights", "row splits", "[0, 1, 3]", "[0, 2, 3]")
    assert ev.export()[0].numpy().size == 0


def test_graph_sp_weights_of_known_other_indices_are_refused_while_building(sok, rng):
    batch = _batch(rng)
    with ref.graph_session():
        ev = sok.get_embedding_variable("emb", embedding_dim=4)
        with pytest.raises(ValueError) as error:
            sok.lookup_sparse([ev], [batch.sp_ids()],
                              combiners=["sum"],
                              sp_weights=[_shifted_weights(batch)])
    assert ref.error_names(error.value, "sp_weights[0]", "indices[0]")


def test_fed_sp_weights_of_another_batch_are_refused_at_run_time_inserting_nothing(sok, rng):
    batch = _batch(rng)
    with ref.graph_session() as sess:
        ev = sok.get_embedding_variable("emb", embedding_dim=4)
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        weights = tf.compat.v1.sparse_placeholder(tf.float32)
        out = sok.lookup_sparse([ev], [ids], combiners=["sum"], sp_weights=[weights])[0]
        keys, _ = ev.export()
        sess.run(tf.compat.v1.global_variables_initializer())
        longer = [batch.batch_size + 1, batch.max_hotness]
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            sess.run(
                out, {
                    ids: batch.ids_value(),
                    weights: tf.compat.v1.SparseTensorValue(batch.indices, batch.weights, longer)
                })
        assert ref.error_names(error.value, "sp_weights[0]", "dense_shape[0]")
        assert sess.run(keys).size == 0


# --------------------------------------------------------------------------- optimizers

UNSUPPORTED_OPTIMIZERS = {
    "ProximalAdagradOptimizer":
        lambda: tf.compat.v1.train.ProximalAdagradOptimizer(0.1),
    "AdadeltaOptimizer":
        lambda: tf.compat.v1.train.AdadeltaOptimizer(0.1),
    "ProximalGradientDescentOptimizer":
        lambda: tf.compat.v1.train.ProximalGradientDescentOptimizer(0.1),
}
SUPPORTED_NAMES = ["GradientDescent", "Adagrad", "Adam", "Ftrl", "Momentum", "RMSProp"]


@pytest.mark.parametrize("optimizer", sorted(UNSUPPORTED_OPTIMIZERS))
def test_unsupported_optimizer_on_an_ev_raises_listing_supported_ones(sok, rng, optimizer):
    with ref.graph_session():
        ev = sok.get_embedding_variable("emb", embedding_dim=4)
        loss = tf.reduce_sum(sok.lookup_sparse([ev], [_batch(rng).sp_ids()])[0])
        with pytest.raises(TypeError) as error:
            UNSUPPORTED_OPTIMIZERS[optimizer]().minimize(loss)
    assert ref.error_names(error.value, optimizer.replace("Optimizer", ""), *SUPPORTED_NAMES)


def test_a_kernel_error_names_the_eager_variable_as_the_user_did(sok):
    # Several eager variables may share a name, as tf.Variables do; each has
    # its own table, and a kernel's error gives the name the user chose.
    tables = [sok.get_embedding_variable("same_name_emb", embedding_dim=4) for _ in range(3)]
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def apply(values):  # a width only the kernel sees
        grad = tf.IndexedSlices(values, tf.constant([1, 2], tf.int64))
        optimizer.apply_gradients([(grad, tables[-1])])

    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        apply(tf.ones([2, 5]))

    assert "Embedding Variable 'same_name_emb'" in str(error.value)
    assert all(t.name == "same_name_emb:0" for t in tables)
    assert len({t._unique_id for t in tables}) == 3  # pylint: disable=protected-access


def test_a_float64_gradient_is_refused_naming_the_table(sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=2)
    grad = tf.IndexedSlices(tf.ones([1, 2], tf.float64), tf.constant([1], tf.int64))
    with pytest.raises(TypeError) as error:
        tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients([(grad, ev)])
    assert ref.error_names(error.value, ev.name, "float64")
    assert int(ev.total_count()) == 0


@pytest.mark.parametrize("value", ["a", None, True])
def test_a_no_permission_value_that_is_no_number_is_refused_naming_the_argument(sok, value):
    with pytest.raises(ValueError) as error:
        sok.InitializerOption(default_value_no_permission=value)
    assert ref.error_names(error.value, "default_value_no_permission", repr(value))


def test_a_lookup_in_a_function_compiled_by_xla_is_refused_before_anything_changes(
        sok, rng, unique_name):
    """sok-ev's kernels have no XLA form: tracing a lookup under
  jit_compile=True raises ValueError naming jit_compile and the fix, and
  inserts nothing; the same function without XLA runs."""
    table = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant(rng.integers(1, 100, 2), tf.int64), [2, 1])

    def lookup():
        return sok.lookup_sparse([table], [ids], combiners=["sum"])[0]

    with pytest.raises(ValueError, match=r"jit_compile=True[\s\S]*jit_compile=False"):
        tf.function(lookup, jit_compile=True)()
    assert int(table.export()[0].shape[0]) == 0
    assert tf.function(lookup)().shape == (2, 4)
