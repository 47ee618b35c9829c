"""One rank of the multi-worker lookup tests (launched by harness.launch).

  python lookup_worker.py --out DIR --cases SCENARIO:PLACEMENT:MODE,... [--guards]

For each case: builds the two tables of harness.TABLES with the placement,
trains 10 Adagrad steps on this rank's part of the scenario's batches
(harness.make_step_data) in graph mode (tf.compat.v1.Session) or eagerly with
a tf.function step (modes "graph", "eager", "packed"), or both through
sok_ev.LookupPipeline ("pipelined", "pipelined_fn"), and records, under "<case>/": this rank's loss and
embeddings of every step, and its final shard of each table (export()).
With --guards, also records the messages of the refused ways of allreducing
an Embedding Variable gradient (see test_guards.py).
"""

import argparse
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

import harness
# Bound before sok_ev.init(), as a script importing it at the top does.
from horovod.tensorflow import allreduce as allreduce_bound_before_init
from horovod.tensorflow.mpi_ops import _allreduce as raw_allreduce_op

hvd.init()
import sok_ev  # pylint: disable=wrong-import-position

sok_ev.init()
RANK, WORKERS = hvd.rank(), hvd.size()
# Alone, the worker still runs the multi-worker pipeline (harness.CASES[1]).
sok_ev.lookup.exchange_on_one_worker = WORKERS == 1


def placement(name):
    """target_gpu of each table: sharded by key, whole on one worker, or a mix
    of both in one lookup_sparse call."""
    return {"sharded": [-1, -1], "target": [WORKERS - 1, 0], "mixed": [-1, WORKERS - 1]}[name]


def model(tables, sparse_ids, targets):
    """sparse_ids: a list of SparseTensors (one lookup of every table), or of
  packed RaggedTensors [1, batch, None] (one packed lookup per table: the
  tables' key dtypes differ)."""
    if isinstance(sparse_ids[0], tf.RaggedTensor):
        embeddings = [
            sok_ev.lookup_sparse([v], ids, "sum")[0] for v, ids in zip(tables, sparse_ids)
        ]
    else:
        embeddings = sok_ev.lookup_sparse(tables, sparse_ids, combiners=["sum"] * len(tables))
    return loss_of(embeddings, targets), embeddings


def loss_of(embeddings, targets):
    return tf.add_n([0.5 * tf.reduce_sum(tf.square(e - y)) for e, y in zip(embeddings, targets)])


def my_feeds(scenario, step):
    batches, targets = harness.make_step_data(scenario, WORKERS, step)
    return batches[RANK], targets[RANK]


def step_signature(tables):
    """A tf.function step's input signature: per table the ids' indices,
  values and dense shape, then the targets (step_inputs' order)."""
    signature = []
    for v in tables:
        signature += [
            tf.TensorSpec([None, 2], tf.int64),
            tf.TensorSpec([None], v.key_dtype),
            tf.TensorSpec([2], tf.int64),
            tf.TensorSpec([None, v.embedding_dim], tf.float32)
        ]
    return signature


def step_inputs(scenario, step):
    """This rank's batch and targets of `step`, flat as step_signature says."""
    batches, targets = my_feeds(scenario, step)
    flat = []
    for t, table in enumerate(harness.TABLES):
        flat += [
            batches[t].indices, batches[t].values,
            np.array([batches[t].batch_size, table["hotness"]]), targets[t]
        ]
    return flat


# What run_graph saw of its graph, for record_case.
_state = {}


def run_graph(scenario, targets_gpu, pipelined=False):
    """A tf.compat.v1.Session step; `pipelined`: through sok_ev.LookupPipeline,
  each step routing the next step's batch (and its targets, as extras)."""
    with tf.Graph().as_default() as graph:
        tables = harness.make_tables(targets_gpu)
        indices = [tf.compat.v1.placeholder(tf.int64, [None, 2]) for _ in tables]
        values = [tf.compat.v1.placeholder(v.key_dtype, [None]) for v in tables]
        sizes = [tf.compat.v1.placeholder(tf.int64, []) for _ in tables]
        ys = [tf.compat.v1.placeholder(tf.float32, [None, v.embedding_dim]) for v in tables]
        sparse_ids = [
            tf.SparseTensor(i, v, tf.stack([s, table["hotness"]]))
            for i, v, s, table in zip(indices, values, sizes, harness.TABLES)
        ]
        if pipelined:
            pipeline = sok_ev.LookupPipeline(tables, ["sum"] * len(tables))
            prime = pipeline.prefetch(sparse_ids, extras=ys)
            embeddings, staged_ys = pipeline.lookup()
            loss = loss_of(embeddings, staged_ys)
        else:
            loss, embeddings = model(tables, sparse_ids, ys)
        train = tf.compat.v1.train.AdagradOptimizer(harness.LEARNING_RATE).minimize(loss)
        last_train = train
        if pipelined:
            train = tf.group(train, pipeline.prefetch(sparse_ids, extras=ys))
        exports = [v.export_full()[:3] for v in tables]
        applies = [op for op in graph.get_operations() if op.type == "SokEv>SparseApplyOptimizer"]
        _state["keys_are_unique"] = [
            flag for op in applies for flag in op.get_attr("keys_are_unique")
        ]
        # Forward and backward row exchanges over sok-ev's own NCCL op.
        _state["nccl_exchanges"] = sum(
            op.type == "SokEv>NcclAlltoall" for op in graph.get_operations())
        _state["key_messages"] = sum(
            op.type == "SokEv>PackKeyMessage" for op in graph.get_operations())
        losses, embs = [], []

        def feed(step):
            batches, targets = my_feeds(scenario, step)
            fed = {}
            for t in range(len(tables)):
                fed.update({
                    indices[t]: batches[t].indices,
                    values[t]: batches[t].values,
                    sizes[t]: batches[t].batch_size,
                    ys[t]: targets[t]
                })
            return fed

        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            if pipelined:
                session.run(prime, feed(0))
            for step in range(harness.STEPS):
                if not pipelined:
                    fetch, fed = train, feed(step)
                elif step + 1 < harness.STEPS:
                    fetch, fed = train, feed(step + 1)
                else:
                    fetch, fed = last_train, {}
                step_loss, step_embs, _ = session.run([loss, embeddings, fetch], fed)
                losses.append(step_loss)
                embs.append(step_embs)
            shards = [_shard(*export) for export in session.run(exports)]
    return losses, embs, shards


def run_eager(scenario, targets_gpu, packed=False):
    """A tf.function step; `packed`: each table's ids as one RaggedTensor
  [1, batch, None] (lookup_sparse's packed form) instead of a SparseTensor."""
    tables = harness.make_tables(targets_gpu)
    optimizer = tf.compat.v1.train.AdagradOptimizer(harness.LEARNING_RATE)
    signature = step_signature(tables)

    @tf.function(input_signature=signature)
    def train_step(*flat):
        sparse_ids = [tf.SparseTensor(*flat[4 * t:4 * t + 3]) for t in range(len(tables))]
        if packed:
            sparse_ids = [tf.expand_dims(tf.RaggedTensor.from_sparse(ids), 0) for ids in sparse_ids]
        ys = [flat[4 * t + 3] for t in range(len(tables))]
        with tf.GradientTape() as tape:
            loss, embeddings = model(tables, sparse_ids, ys)
        grads = tape.gradient(loss, tables)
        optimizer.apply_gradients(zip(grads, tables))
        return loss, embeddings

    losses, embs = [], []
    for step in range(harness.STEPS):
        step_loss, step_embs = train_step(*step_inputs(scenario, step))
        losses.append(step_loss.numpy())
        embs.append([e.numpy() for e in step_embs])
    shards = [_shard(*(x.numpy() for x in v.export_full()[:3])) for v in tables]
    return losses, embs, shards


def run_pipelined_function(scenario, targets_gpu):
    """tf.function steps through sok_ev.LookupPipeline: each step looks up the
  batch the step before routed, trains, then routes the next batch."""
    tables = harness.make_tables(targets_gpu)
    optimizer = tf.compat.v1.train.AdagradOptimizer(harness.LEARNING_RATE)
    pipeline = sok_ev.LookupPipeline(tables, "sum")
    signature = step_signature(tables)

    def prefetch(flat):
        sparse_ids = [tf.SparseTensor(*flat[4 * t:4 * t + 3]) for t in range(len(tables))]
        pipeline.prefetch(sparse_ids, extras=[flat[4 * t + 3] for t in range(len(tables))])

    def train():
        with tf.GradientTape() as tape:
            embeddings, targets = pipeline.lookup()
            loss = loss_of(embeddings, targets)
        grads = tape.gradient(loss, tables)
        optimizer.apply_gradients(zip(grads, tables))
        return loss, embeddings

    @tf.function(input_signature=signature)
    def train_and_prefetch(*flat_next):
        out = train()
        prefetch(flat_next)
        return out

    tf.function(input_signature=signature)(lambda *flat: prefetch(flat))(*step_inputs(scenario, 0))
    last_step = tf.function(train)
    losses, embs = [], []
    for step in range(harness.STEPS):
        if step + 1 < harness.STEPS:
            step_loss, step_embs = train_and_prefetch(*step_inputs(scenario, step + 1))
        else:
            step_loss, step_embs = last_step()
        losses.append(step_loss.numpy())
        embs.append([e.numpy() for e in step_embs])
    shards = [_shard(*(x.numpy() for x in v.export_full()[:3])) for v in tables]
    return losses, embs, shards


def _shard(keys, rows, frequencies):
    """A shard as (keys, values, frequencies): export_full's rows hold the
    value, then the optimizer's slots."""
    dim = rows.shape[1] // 2  # Adagrad: the value and its accumulator
    return keys, rows[:, :dim], frequencies


def record_case(results, case):
    scenario, placement_name, mode = case.split(":")
    if mode in ("graph", "pipelined"):
        losses, embs, shards = run_graph(scenario, placement(placement_name), mode == "pipelined")
    elif mode == "pipelined_fn":
        losses, embs, shards = run_pipelined_function(scenario, placement(placement_name))
    else:
        losses, embs, shards = run_eager(scenario, placement(placement_name), mode == "packed")
    results[f"{case}/loss"] = np.array(losses, np.float64)
    for t in range(len(harness.TABLES)):
        results[f"{case}/emb{t}"] = np.stack([e[t] for e in embs])
        results[f"{case}/keys{t}"] = shards[t][0].astype(np.int64)
        results[f"{case}/values{t}"] = shards[t][1]
        results[f"{case}/frequencies{t}"] = shards[t][2]
    if mode in ("graph", "pipelined"):
        results[f"{case}/keys_are_unique"] = np.array(_state.pop("keys_are_unique"))
        results[f"{case}/key_messages"] = np.array(_state.pop("key_messages"))
        results[f"{case}/nccl_exchanges"] = np.array(_state.pop("nccl_exchanges"))


def _message_of(build):
    """The ValueError message `build()` raises, "" when it raises nothing, or
    another error's type and message (a collective that ran and failed)."""
    try:
        build()
    except ValueError as error:
        return str(error)
    except Exception as error:  # pylint: disable=broad-except
        return f"{type(error).__name__}: {error}"
    return ""


def record_guards(results):
    """Each way of allreducing an Embedding Variable gradient, and its error."""
    batches, targets = my_feeds("random", 0)

    def sparse_ids():
        return [
            tf.SparseTensor(b.indices, b.values, [b.batch_size, table["hotness"]])
            for b, table in zip(batches, harness.TABLES)
        ]

    with tf.Graph().as_default():
        tables = harness.make_tables([-1, -1])
        dense = tf.compat.v1.get_variable("dense", initializer=tf.ones([4]))
        loss, embeddings = model(tables, sparse_ids(), targets)
        loss += tf.reduce_sum(dense * embeddings[1])
        optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
        results["guard/graph_distributed_optimizer"] = _message_of(
            lambda: hvd.DistributedOptimizer(optimizer).minimize(loss))
        grads_and_vars = optimizer.compute_gradients(loss)
        ev_grad = grads_and_vars[0][0]
        results["guard/graph_allreduce"] = _message_of(lambda: hvd.allreduce(ev_grad))
        results["guard/graph_grouped_allreduce"] = _message_of(
            lambda: hvd.grouped_allreduce([g for g, _ in grads_and_vars]))
        # Allreducing only the values, keeping the indices (would double updates).
        results["guard/graph_values_only"] = _message_of(lambda: hvd.allreduce(ev_grad.values))
        results["guard/graph_bound_before_init"] = _message_of(
            lambda: allreduce_bound_before_init(ev_grad))
        # Horovod's inner function, bound before sok_ev.init().
        results["guard/graph_raw_op"] = _message_of(lambda: raw_allreduce_op(ev_grad.values))
        # A reduction no guard at the call sees (of values made anew, with no
        # mark): the fused apply finds the Horovod op between the gradient
        # and the lookup.
        reduced = tf.IndexedSlices(raw_allreduce_op(ev_grad.values * 1.0), ev_grad.indices)
        results["guard/graph_raw_reduction_at_apply"] = _message_of(
            lambda: optimizer.apply_gradients([(reduced, tables[0])]))
        # The supported pattern: allreduce only the dense gradients.
        results["guard/graph_dense_only"] = _message_of(lambda: optimizer.apply_gradients(
            [(g if isinstance(v, sok_ev.EmbeddingVariable) else hvd.allreduce(g), v)
             for g, v in grads_and_vars]))

    tables = harness.make_tables([-1, -1])

    def tape_gradient(tape_factory):
        with tape_factory() as tape:
            loss, _ = model(tables, sparse_ids(), targets)
        return tape.gradient(loss, tables)

    results["guard/eager_distributed_tape"] = _message_of(
        lambda: tape_gradient(lambda: hvd.DistributedGradientTape(tf.GradientTape())))
    eager_grads = tape_gradient(tf.GradientTape)
    results["guard/eager_allreduce"] = _message_of(lambda: hvd.allreduce(eager_grads[0]))
    results["guard/eager_values_only"] = _message_of(lambda: hvd.allreduce(eager_grads[0].values))
    before = _sorted_export(tables[0])
    results["guard/eager_bound_before_init"] = _message_of(
        lambda: allreduce_bound_before_init(eager_grads[0]))
    # Horovod's inner function, bound before sok_ev.init(): no module
    # attribute the guard replaced is on its way.
    results["guard/eager_raw_op"] = _message_of(lambda: raw_allreduce_op(eager_grads[0].values))
    # A gradient made anew (no mark for the Horovod guards to see), reduced,
    # then applied: its keys are now every worker's.
    grad = eager_grads[0]
    remade = tf.IndexedSlices(grad.values * 1.0, grad.indices + 0, grad.dense_shape)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    results["guard/eager_reduced_at_apply"] = _message_of(
        lambda: optimizer.apply_gradients([(hvd.allreduce(remade, op=hvd.Sum), tables[0])]))
    after = _sorted_export(tables[0])
    results["guard/eager_shard_unchanged"] = np.array(
        all(np.array_equal(a, b) for a, b in zip(before, after)))


def _sorted_export(table):
    """The shard's keys and rows in key order (exports come in no order; a
    GPU table's differs from call to call)."""
    keys, rows = (x.numpy() for x in table.export())
    order = np.argsort(keys)
    return keys[order], rows[order]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="")
    parser.add_argument("--guards", action="store_true")
    args = parser.parse_args()
    results = {}
    for case in filter(None, args.cases.split(",")):
        record_case(results, case)
    if args.guards:
        record_guards(results)
    harness.save_rank_results(args.out, RANK, results)
    print(f"rank {RANK}: done", file=sys.stderr)


if __name__ == "__main__":
    main()
