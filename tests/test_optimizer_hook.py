"""The optimizer hook is narrow: installed by sok_ev.init() (without it, on one
worker, by the first Embedding Variable, so that training works), never by
import; it changes nothing for variables that are not Embedding Variables;
and the private TensorFlow names it replaces exist, with the parameters it
expects, in the installed TensorFlow.
"""
import inspect
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import optimizer as optimizer_module

from sok_ev_reference import graph_session, sok_ev_import_root

# What sok_ev/optimizers.py replaces, and the parameters it relies on.
HOOKED = {
    "_get_processor": ["v"],
    "Optimizer.apply_gradients": [
        "self", "grads_and_vars", "global_step", "name", "skip_gradients_aggregation"
    ],
    "Optimizer._zeros_slot": ["self", "var", "slot_name", "op_name"],
    "Optimizer._get_or_make_slot": ["self", "var", "val", "slot_name", "op_name"],
    "Optimizer._get_or_make_slot_with_initializer": [
        "self", "var", "initializer", "shape", "dtype", "slot_name", "op_name"
    ],
}


def _resolve(dotted):
    target = optimizer_module
    for part in dotted.split("."):
        target = getattr(target, part)
    return target


def test_hooked_tensorflow_functions_exist_with_the_expected_parameters(sok):
    sok.optimizers.uninstall_optimizer_hook()
    try:
        for name, parameters in HOOKED.items():
            assert list(inspect.signature(_resolve(name)).parameters) == parameters, (
                f"TensorFlow {tf.__version__} changed {name}; sok_ev/optimizers.py "
                "must be updated")
    finally:
        sok.init()


def test_importing_sok_ev_installs_no_hook():
    script = textwrap.dedent("""
        from tensorflow.python.training import optimizer
        before = (optimizer._get_processor, optimizer.Optimizer._zeros_slot)
        import sok_ev
        after = (optimizer._get_processor, optimizer.Optimizer._zeros_slot)
        assert before == after, "import patched TensorFlow"
        sok_ev.init()
        assert optimizer._get_processor is not before[0], "init did not install"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script],
                            capture_output=True,
                            text=True,
                            cwd=sok_ev_import_root(),
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr


def test_init_twice_wraps_once_and_uninstall_restores_tensorflow(sok):
    sok.init()
    hooked = optimizer_module._get_processor
    sok.init()
    assert optimizer_module._get_processor is hooked
    sok.optimizers.uninstall_optimizer_hook()
    try:
        assert optimizer_module._get_processor.__module__ == optimizer_module.__name__
        for name in HOOKED:
            assert _resolve(name).__module__ == optimizer_module.__name__, name
    finally:
        sok.init()


def _train_dense_model(make_optimizer, initial_values, batches):
    """Trains two dense variables (one with sparse gradients) in a Session."""
    with graph_session() as sess:
        table = tf.compat.v1.get_variable("table", initializer=initial_values[0], use_resource=True)
        weights = tf.compat.v1.get_variable("weights",
                                            initializer=initial_values[1],
                                            use_resource=True)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf.nn.embedding_lookup(table, ids)
        loss = tf.reduce_sum(tf.square(tf.matmul(rows, weights)))
        train = make_optimizer().minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in batches:
            sess.run(train, {ids: batch})
        return sess.run([table, weights])


@pytest.mark.parametrize("make_optimizer", [
    lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
    lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5),
],
                         ids=["adagrad", "adam", "ftrl", "rmsprop"])
def test_hook_leaves_dense_variables_bit_identical(sok, rng, make_optimizer):
    initial = [
        rng.normal(size=(20, 4)).astype(np.float32),
        rng.normal(size=(4, 2)).astype(np.float32)
    ]
    batches = [rng.integers(0, 20, size=8) for _ in range(4)]
    with_hook = _train_dense_model(make_optimizer, initial, batches)
    sok.optimizers.uninstall_optimizer_hook()
    try:
        without_hook = _train_dense_model(make_optimizer, initial, batches)
    finally:
        sok.init()
    for hooked, stock in zip(with_hook, without_hook):
        np.testing.assert_array_equal(hooked, stock)


def test_training_on_one_worker_without_init_updates_as_tensorflow_does():
    # A script that never calls sok_ev.init() (in a fresh process: this one
    # called it) trains with a stock optimizer; the rows it prints must be
    # those TensorFlow's Adagrad gives a dense table trained the same way.
    script = textwrap.dedent("""
        import json
        import tensorflow as tf
        import sok_ev
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            ev = sok_ev.get_embedding_variable("emb", embedding_dim=2,
                                               initializer=tf.ones_initializer())
            ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([3, 5, 3], tf.int64),
                                  [2, 2])
            emb = sok_ev.lookup_sparse([ev], [ids], combiners=["sum"])[0]
            loss = tf.reduce_sum(emb * emb)
            train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            keys, rows = sess.run(ev.export())
        graph = {int(k): r.tolist() for k, r in zip(keys, rows)}
        # Eagerly (where the dense sparse-apply op failed with "Invalid
        # variable reference").
        ev = sok_ev.get_embedding_variable("emb", embedding_dim=2,
                                           initializer=tf.ones_initializer())
        opt = tf.compat.v1.train.AdagradOptimizer(0.5)
        ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([3, 5, 3], tf.int64), [2, 2])
        for _ in range(3):
            with tf.GradientTape() as tape:
                emb = sok_ev.lookup_sparse([ev], [ids], combiners=["sum"])[0]
                loss = tf.reduce_sum(emb * emb)
            opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))
        keys, rows = (t.numpy() for t in ev.export())
        eager = {int(k): r.tolist() for k, r in zip(keys, rows)}
        print(json.dumps([graph, eager]))
    """)
    result = subprocess.run([sys.executable, "-c", script],
                            capture_output=True,
                            text=True,
                            cwd=sok_ev_import_root(),
                            timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    import json  # pylint: disable=import-outside-toplevel
    runs = json.loads(result.stdout.splitlines()[-1])
    with graph_session() as sess:
        table = tf.compat.v1.get_variable("table", initializer=tf.ones([6, 2]), use_resource=True)
        ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([3, 5, 3], tf.int64), [2, 2])
        emb = tf.nn.embedding_lookup_sparse(table, ids, None, combiner="sum")
        train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(tf.reduce_sum(emb * emb))
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        want = sess.run(table)
    for mode, got in zip(["graph", "eager"], runs):
        assert sorted(got) == ["3", "5"], mode
        for key in (3, 5):
            np.testing.assert_allclose(got[str(key)], want[key], rtol=1e-6, err_msg=f"{mode} {key}")
