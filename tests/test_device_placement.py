"""sok-ev's ops run on GPU:0 when TensorFlow sees a GPU, and on the CPU otherwise.

TensorFlow quietly runs an op on the CPU when it has no GPU kernel for it, so
a GPU kernel missing from the op library (a CPU build, an unregistered dtype)
would only show as a slow run. Here one training step of two tables (int64
keys with 'sum', int32 keys with 'mean'; lookup, backward, Adagrad) and an
export run in a Session that records where every node ran, and each SokEv op
it executed must have run on the expected device: GPU:0 where a GPU is
visible (the op library must then be a GPU build), the CPU where none is.
Nothing is skipped: on CPU-only CI this pins the CPU placement, on the device
the GPU one.
"""
import numpy as np
import tensorflow as tf

import sok_ev_reference as ref

PREFIX = "SokEv>"


def _expected_device():
    if tf.config.list_physical_devices("GPU"):
        return "/device:GPU:0"
    return "/device:CPU:0"


def executed_ops_by_device(sess, fetches, feed_dict):
    """{SokEv op type: set of devices it ran on} for one traced run."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    sess.run(fetches, feed_dict, options=options, run_metadata=metadata)
    graph = sess.graph
    ran = {}
    for device_stats in metadata.step_stats.dev_stats:
        for node in device_stats.node_stats:
            try:
                op_type = graph.get_operation_by_name(node.node_name).type
            except (KeyError, ValueError):
                continue  # _SOURCE and other executor-internal nodes
            if op_type.startswith(PREFIX):
                # Stream entries ("/device:GPU:0/stream:...") count as GPU:0.
                device = "/device:" + device_stats.device.split("/device:")[1].split("/")[0]
                ran.setdefault(op_type, set()).add(device)
    return ran


def test_every_sok_ev_op_of_a_training_step_runs_on_the_expected_device(sok, rng):
    expected = _expected_device()
    if expected.endswith("GPU:0"):
        assert sok._ops.build_info().get("cuda"), (
            "a GPU is visible but the op library has no GPU kernels: it was built for "
            f"{sok._ops.describe_build(sok._ops.build_info())}")
    matrices = [ref.random_matrix(rng, 16, 8), ref.random_matrix(rng, 8, 4)]
    key_dtypes = [np.int64, np.int32]
    with ref.graph_session() as sess:
        evs = [
            ref.matrix_ev(sok, f"placement_{t}", m, key_dtype=k)
            for t, (m, k) in enumerate(zip(matrices, key_dtypes))
        ]
        ids = [
            tf.compat.v1.sparse_placeholder(tf.as_dtype(k), shape=[None, None]) for k in key_dtypes
        ]
        embeddings = sok.lookup_sparse(evs, ids, combiners=["sum", "mean"])
        loss = tf.add_n([tf.reduce_sum(e * e) for e in embeddings])
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        feed = {}
        for placeholder, key_dtype, matrix in zip(ids, key_dtypes, matrices):
            batch = ref.random_sparse_batch(
                rng, 6, 3, ref.key_sampler(rng, "in_range", len(matrix), key_dtype), key_dtype)
            feed[placeholder] = batch.ids_value()
        ran = executed_ops_by_device(sess, [train] + [ev.export() for ev in evs], feed)

    # The step must have run the lookup, backward and apply stages natively.
    assert len(ran) >= 3 and any("Apply" in op for op in ran), sorted(ran)
    misplaced = {op: sorted(devices) for op, devices in ran.items() if devices != {expected}}
    assert not misplaced, (f"SokEv ops not (only) on {expected}: {misplaced}; all: "
                           f"{ {op: sorted(d) for op, d in ran.items()} }")


def _cpu_placed(tensor):
    """Requested on the CPU, and colocated with nothing else (a colocation
    with a GPU variable could not be placed, or would move its group)."""
    op = tensor.op
    return "CPU" in op.device.upper() and op.colocation_groups() == [f"loc:@{op.name}".encode()]


def test_constant_host_memory_inputs_are_built_on_the_cpu(sok, rng):
    # The GPU kernels read dense shapes, hyperparameters and the step in host
    # memory; a constant of them placed beside the op on the GPU would be
    # copied back to the host in every step. A dense shape fed at run time
    # still reaches the op as it is.
    with ref.graph_session() as sess:
        matrix = ref.random_matrix(rng, 8, 4)
        ev = ref.matrix_ev(sok, "host_inputs", matrix)
        constant_ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 3], tf.int64), [2, 1])
        fed_ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
        with tf.device(_expected_device()):
            constant_out, fed_out = sok.lookup_sparse([ev, ev], [constant_ids, fed_ids])
            train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(
                tf.reduce_sum(constant_out) + tf.reduce_sum(fed_out))
        graph = sess.graph
        unique = [op for op in graph.get_operations() if op.type == "SokEv>UniqueKeys"]
        apply = [op for op in graph.get_operations() if op.type == "SokEv>SparseApplyOptimizer"]
        assert len(unique) == 1 and len(apply) == 1
        shapes = unique[0].inputs[-2:]  # dense_shapes, in table order
        assert _cpu_placed(shapes[0]) and shapes[0].op.type == "Const"
        assert not _cpu_placed(shapes[1]), shapes[1].op.device
        hyperparameters, step = apply[0].inputs[-2:]
        assert _cpu_placed(hyperparameters) and hyperparameters.op.type == "Const"
        assert _cpu_placed(step) and step.op.type == "Const"

        sess.run(tf.compat.v1.global_variables_initializer())
        fed = tf.compat.v1.SparseTensorValue([[0, 0], [1, 0], [1, 1]], [1, 3, 5], [2, 2])
        rows = sess.run(constant_out, {fed_ids: fed})
        np.testing.assert_array_equal(rows, ref.initial_rows(matrix, [1, 3]))
        sess.run(train, {fed_ids: fed})
        trained = sess.run(constant_out, {fed_ids: fed})
        assert np.all(trained != rows)  # the step ran with these inputs


def _ops_taking_the_handle(graph, variable):
    """Every op of `graph` that takes `variable`'s table handle as an input."""
    handle = variable.handle
    return [op for op in graph.get_operations() if any(t is handle for t in op.inputs)]


def test_checkpoint_ops_ask_for_no_device_of_their_own_for_a_graph_table_without_one(sok):
    """A graph table with no device is placed by TensorFlow together with
  every op that takes its handle. The incremental Saver's save marks are
  built inside the checkpoint merge's /cpu:0 scope; had they asked for that
  device, a GPU user's table would silently be placed on the CPU (on an
  H200 an HBM_DRAM table then refused to initialize)."""
    with ref.graph_session() as sess:
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        table = sok.get_embedding_variable("placed_by_tensorflow", embedding_dim=4)
        loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
        sok.Saver(incremental_save_restore=True)
        assert table.device == ""
        takers = _ops_taking_the_handle(sess.graph, table)
        assert {op.type for op in takers} >= {
            "SokEv>MarkEmbeddingVariablesSaved", "SokEv>SaveEmbeddingVariables",
            "SokEv>RestoreEmbeddingVariables"
        }
        asked = {op.name: op.device for op in takers if op.device}
        assert asked == {}, f"ops taking the table's handle ask for a device: {asked}"


def test_checkpoint_ops_tie_no_helper_op_to_a_graph_table_without_a_device(sok):
    """The Savers' ops on a table with no device leave its placement to
  TensorFlow without colocating anything with it: a colocated string join
  (CPU kernels only) would force the table's whole group, its GPU lookup
  included, onto one device that cannot run both, and every Session on a
  GPU failed to place the graph. Only TensorFlow's optimizer colocates its
  update with the variable, as it does for its own variables."""
    with ref.graph_session() as sess:
        ids = tf.compat.v1.sparse_placeholder(tf.int64)
        table = sok.get_embedding_variable("kept_apart", embedding_dim=4)
        loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        sok.Saver(incremental_save_restore=True)
        sok.Saver()
        tag = f"loc:@{table.handle.op.name}".encode()
        tied = [
            op.name for op in sess.graph.get_operations() if tag in op.colocation_groups() and
            op is not table.handle.op and not op.name.startswith("Adagrad/update_")
        ]
        assert tied == [], f"ops colocated with the table: {tied}"


def test_ragged_ids_become_sparse_without_an_op_that_has_only_a_cpu_kernel(sok):
    """RaggedTensorToSparse has a CPU kernel only: on a GPU, ids given as a
  RaggedTensor went to the host and back every step (MLPerf's 14M ids a
  batch looked up 3x slower than as a SparseTensor, H200, 2026-11-29)."""
    graph = tf.Graph()
    with graph.as_default():
        table = sok.get_embedding_variable("ragged", embedding_dim=4)
        ids = tf.compat.v1.ragged.placeholder(tf.int64, 1, [])
        sok.lookup_sparse([table], [ids], combiners="sum")
    kinds = {op.type for op in graph.get_operations()}
    assert "RaggedTensorToSparse" not in kinds
    assert any(kind.startswith("SokEv") for kind in kinds)
