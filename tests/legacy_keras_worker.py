"""Runs sok-ev under legacy Keras (TF_USE_LEGACY_KERAS=1, tf_keras) and
writes what tests/test_legacy_keras.py checks.

Usage: TF_USE_LEGACY_KERAS=1 python legacy_keras_worker.py OUT.npz SEED

Writes to OUT.npz, for each tf_keras optimizer in OPTIMIZERS and each mode
("eager", "tf_function"), and for each tf.compat.v1.train optimizer in
V1_OPTIMIZERS in mode "graph" (a DeepRec TF1 script: a tf.compat.v1
Session, the kernel from tf.compat.v1.layers.dense; tf_keras's own
optimizers do not update dense variables in a TF1 graph):
  <optimizer>/<mode>/ev/<step>     rows of the batch keys seen so far, in
                                   the order of .../keys/<step>;
  <optimizer>/<mode>/keys/<step>   those keys (int64);
  <optimizer>/<mode>/kernel/<step> the dense layer's kernel [DIM, 1];
  <optimizer>/<mode>/iterations    the optimizer's step count at the end;
and the reference: the same model with the same optimizer on a dense
variable holding the EV's initial rows (tf_keras: fed the dense gradient,
duplicates summed as the EV's are; tf.compat.v1.train: the same graph with
tf.nn.embedding_lookup_sparse of the dense variable):
<optimizer>/reference/table/<step> [N_ROWS, DIM] and
<optimizer>/reference/kernel/<step>. Also the json facts
in "facts" (a 0-d string array): which Keras is tf.keras, what sok-ev
hooked, and the messages of the refusals this module provokes.
"""
import json
import sys

import numpy as np
import tensorflow as tf

import sok_ev
import sok_ev_reference as ref
from sok_ev import keras_optimizers

N_ROWS, DIM, STEPS = 12, 3, 3
KERAS = tf.keras.optimizers
# Each optimizer's dense Keras update equals sok-ev's lazy one row for row
# for STEPS steps: SGD and Adagrad always; Adam and RMSprop on their first
# step only (later, Keras's dense Adam also moves rows outside the batch, and
# its dense RMSprop decays their velocity).
OPTIMIZERS = {
    "sgd": (lambda: KERAS.SGD(0.3), STEPS),
    # tf_keras's loss scaling around it (gradients given unscaled, as it expects).
    "sgd_loss_scaled": (lambda: tf.keras.mixed_precision.LossScaleOptimizer(KERAS.SGD(0.3)), STEPS),
    # Clipped on every step by the joint norm of the table's and kernel's gradients.
    "sgd_global_clipnorm": (lambda: KERAS.SGD(0.3, global_clipnorm=0.05), STEPS),
    "adagrad": (lambda: KERAS.Adagrad(0.2, initial_accumulator_value=0.3), STEPS),
    "adam": (lambda: KERAS.Adam(0.05, beta_1=0.8, beta_2=0.9, epsilon=1e-6), 1),
    "rmsprop": (lambda: KERAS.RMSprop(0.05, rho=0.8, momentum=0.5, epsilon=1e-6, centered=True), 1),
}
V1_OPTIMIZERS = {
    "v1_sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.3),
    "v1_adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.2, initial_accumulator_value=0.3),
}


def _facts():
    facts = {
        "keras_optimizer_module": KERAS.Optimizer.__module__,
        "legacy_keras": keras_optimizers.legacy_keras(),
    }
    sok_ev.init()
    sok_ev.install_deeprec_api()
    facts["hook_installed"] = keras_optimizers.keras_optimizer_hook_installed()
    facts["apply_gradients_hooked"] = (
        KERAS.Optimizer.apply_gradients.__module__ == keras_optimizers.__name__)
    facts["tf_has_get_embedding_variable"] = hasattr(tf.compat.v1, "get_embedding_variable")
    facts["tf_layers_dense"] = hasattr(tf.compat.v1.layers, "dense")
    return facts


def _refusal(make_call):
    try:
        make_call()
    except (ValueError, TypeError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _refusals(matrix):
    ev = ref.matrix_ev(sok_ev, "refused", matrix)
    grad = tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([3], tf.int64))
    return {
        "adaptive_epsilon":
            _refusal(lambda: KERAS.Adam(0.1, adaptive_epsilon=True).apply_gradients([(grad, ev)])),
        "rows_after_refusals":
            ev.export()[0].numpy().tolist(),
    }


def _loss_scale_skips(matrix):
    """tf_keras's LossScaleOptimizer on an Embedding Variable and a dense
  variable, then on a dense variable alone (the reference), both given an
  infinite gradient, then a finite one: what each holds after each step."""
    facts = {}
    for name, with_table in (("loss_scale_ev", True), ("loss_scale_dense", False)):
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(KERAS.SGD(0.5),
                                                                initial_scale=2.0**8)
        dense = tf.Variable(np.ones((2, DIM), np.float32))
        ev = ref.matrix_ev(sok_ev, name, matrix)
        steps = []
        for value in (np.inf, 1.0):
            pairs = [(tf.fill((2, DIM), value), dense)]
            if with_table:
                pairs.append((tf.IndexedSlices(tf.fill((1, DIM), value),
                                               tf.constant([3], tf.int64)), ev))
            optimizer.apply_gradients(pairs)
            steps.append({
                "iterations": int(optimizer.iterations.numpy()),
                "loss_scale": float(optimizer.loss_scale.numpy()),
                "dense": float(dense.numpy()[0, 0]),
                "row": ev.sparse_read(tf.constant([3], tf.int64)).numpy()[0].tolist(),
            })
        facts[name] = steps
    facts["matrix_row_3"] = matrix[3].tolist()
    return facts


def _record(out, prefix, step, ev_rows, kernel):
    keys, rows = ev_rows
    order = np.argsort(keys)
    out[f"{prefix}/keys/{step}"] = np.asarray(keys)[order].astype(np.int64)
    out[f"{prefix}/ev/{step}"] = np.asarray(rows)[order]
    out[f"{prefix}/kernel/{step}"] = np.asarray(kernel)


def _train_eager(out, name, mode, matrix, kernel, batches, upstreams, steps):
    ev = ref.matrix_ev(sok_ev, f"{name}_{mode}", matrix)
    weights = tf.Variable(kernel)
    optimizer = OPTIMIZERS[name][0]()

    def step(indices, keys, shape, upstream):
        with tf.GradientTape() as tape:
            embeddings = sok_ev.lookup_sparse([ev], [tf.SparseTensor(indices, keys, shape)],
                                              "sum")[0]
            loss = tf.reduce_sum(tf.matmul(embeddings, weights) * upstream)
        grads = tape.gradient(loss, [ev, weights])
        optimizer.apply_gradients(zip(grads, [ev, weights]))

    step = tf.function(step) if mode == "tf_function" else step
    for t in range(steps):
        b = batches[t]
        step(b.indices, b.keys, np.array(b.dense_shape, np.int64), upstreams[t])
        _record(out, f"{name}/{mode}", t, [x.numpy() for x in ev.export()], weights.numpy())
    out[f"{name}/{mode}/iterations"] = np.int64(optimizer.iterations.numpy())


def _train_graph(out, name, matrix, kernel, batches, upstreams, dense_reference=False):
    """A DeepRec TF1 script's step with V1_OPTIMIZERS[name]: on an Embedding
    Variable, or (dense_reference) on a dense variable holding `matrix`."""
    mode = "reference" if dense_reference else "graph"
    with ref.graph_session() as sess:
        sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
        upstream = tf.compat.v1.placeholder(tf.float32, shape=[None, 1])
        if dense_reference:
            table = tf.compat.v1.get_variable("table", initializer=matrix, use_resource=True)
            embeddings = tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner="sum")
            # Trailing empty samples are dropped by embedding_lookup_sparse.
            missing = tf.shape(upstream)[0] - tf.shape(embeddings)[0]
            embeddings = tf.pad(embeddings, [[0, missing], [0, 0]])
        else:
            ev = ref.matrix_ev(sok_ev, f"{name}_graph", matrix)
            embeddings = sok_ev.lookup_sparse([ev], [sp_ids], "sum")[0]
        logits = tf.compat.v1.layers.dense(embeddings,
                                           1,
                                           use_bias=False,
                                           kernel_initializer=tf.constant_initializer(kernel))
        loss = tf.reduce_sum(logits * upstream)
        train = V1_OPTIMIZERS[name]().minimize(loss)
        kernel_variable = [v for v in tf.compat.v1.trainable_variables() if "kernel" in v.name][0]
        sess.run(tf.compat.v1.global_variables_initializer())
        for t, (batch, up) in enumerate(zip(batches, upstreams)):
            sess.run(train, {sp_ids: batch.ids_value(), upstream: up})
            if dense_reference:
                out[f"{name}/reference/table/{t}"] = sess.run(table)
                out[f"{name}/reference/kernel/{t}"] = sess.run(kernel_variable)
            else:
                _record(out, f"{name}/graph", t, sess.run(ev.export()), sess.run(kernel_variable))


def _train_reference(out, name, matrix, kernel, batches, upstreams, steps):
    table = tf.Variable(matrix)
    weights = tf.Variable(kernel)
    optimizer = OPTIMIZERS[name][0]()
    for t in range(steps):
        with tf.GradientTape() as tape:
            embeddings = ref.dense_lookup_sparse(table, batches[t], "sum", False)
            loss = tf.reduce_sum(tf.matmul(embeddings, weights) * upstreams[t])
        table_grad, weights_grad = tape.gradient(loss, [table, weights])
        optimizer.apply_gradients([(tf.convert_to_tensor(table_grad), table),
                                   (weights_grad, weights)])
        out[f"{name}/reference/table/{t}"] = table.numpy().copy()
        out[f"{name}/reference/kernel/{t}"] = weights.numpy().copy()


def main(path, seed):
    rng = np.random.default_rng(seed)
    facts = _facts()
    out = {}
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    kernel = ref.random_matrix(rng, DIM, 1)
    batches = [
        ref.random_sparse_batch(rng, 6, 3, lambda n: rng.integers(0, N_ROWS, size=n), np.int64)
        for _ in range(STEPS)
    ]
    upstreams = [rng.normal(size=(b.batch_size, 1)).astype(np.float32) for b in batches]
    for name, (_, steps) in OPTIMIZERS.items():
        for mode in ("eager", "tf_function"):
            _train_eager(out, name, mode, matrix, kernel, batches, upstreams, steps)
        _train_reference(out, name, matrix, kernel, batches, upstreams, steps)
    for name in V1_OPTIMIZERS:
        _train_graph(out, name, matrix, kernel, batches, upstreams)
        _train_graph(out, name, matrix, kernel, batches, upstreams, dense_reference=True)
    facts.update(_refusals(matrix))
    facts.update(_loss_scale_skips(matrix))
    out["matrix"] = matrix
    for t, b in enumerate(batches):
        out[f"batch_keys/{t}"] = b.keys.astype(np.int64)
    out["facts"] = np.array(json.dumps(facts))
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
