"""Trains sok_ev.keras models with tf_keras's fit (TF_USE_LEGACY_KERAS=1) and
their keras.layers.Embedding twins; writes what tests/test_tf_keras_fit.py
checks.

Usage: TF_USE_LEGACY_KERAS=1 python tf_keras_fit_worker.py OUT.npz SEED

For each case of FITS, "<case>/<model>/<field>" with model in {sok, twin}
and field in {batch, iterations, rows, kernel, loss}, one entry per callback
step (keras_twins.History). Also "<case>/seen" (the ids the batches looked
up) and "matrix/<case>" (the initial rows), and the json "facts": which
Keras ran, the refusals' messages and the table sizes after them, the
evaluate/predict and saving round trips' results.
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import sok_ev
import keras_twins as twins

N_ROWS, DIM, BATCH = 12, 4, 6
# Rows the batches of SGD and Adagrad never look up (they must not move).
LEFT_OUT = 3
# case -> (optimizer, input kind, id dtype, steps, steps_per_execution).
FITS = {
    "sgd": ("sgd", "dense_pooled", np.int32, 4, 1),
    "adagrad": ("adagrad", "ragged", np.int64, 4, 1),
    "adam": ("adam", "sparse", np.int32, 4, 1),
    "ftrl": ("ftrl", "dense", np.int64, 4, 1),
    "adagrad_steps_per_execution": ("adagrad", "ragged", np.int32, 6, 3),
    "adam_steps_per_execution": ("adam", "dense_pooled", np.int64, 6, 3),
}
REFUSED = {
    "Adadelta": lambda: tf.keras.optimizers.Adadelta(0.1),
    "Adamax": lambda: tf.keras.optimizers.Adamax(0.1),
}


def _models(rng, kind, matrix=None, kernel=None, name=None):
    matrix = twins.random_matrix(rng, N_ROWS, DIM) if matrix is None else matrix
    width = DIM * (3 if kind == "dense" else 1)
    kernel = rng.normal(size=(width, 1)).astype(np.float32) if kernel is None else kernel
    layer = twins.sok_layer(sok_ev, matrix, twins.COMBINER[kind], name=name)
    twin = twins.DenseTwin(matrix, twins.COMBINER[kind])
    return (twins.Tower(layer, kernel), layer), (twins.Tower(twin, kernel), twin), matrix, kernel


def _fit(out, case, rng):
    optimizer, kind, id_dtype, steps, per_execution = FITS[case]
    (model, layer), (twin_model, twin), matrix, _ = _models(rng, kind)
    data = twins.batches(rng,
                         kind,
                         id_dtype,
                         steps,
                         BATCH,
                         N_ROWS,
                         cover_all=optimizer in twins.NOT_LAZY_ON_DENSE,
                         leave_out=LEFT_OUT)
    for name, m, read in (("sok", model, lambda: twins.table_rows(layer, N_ROWS)),
                          ("twin", twin_model, twin.rows)):
        m.compile(optimizer=twins.OPTIMIZERS[optimizer](),
                  loss="mse",
                  steps_per_execution=per_execution)
        history = twins.History(read)
        m.fit(twins.as_dataset(data), epochs=1, verbose=0, callbacks=[history], shuffle=False)
        for field in ("batch", "iterations", "rows", "kernel", "loss"):
            out[f"{case}/{name}/{field}"] = np.array([s[field] for s in history.steps])
    out[f"matrix/{case}"] = matrix
    seen = set()
    for (ids, _), _ in data:
        values = ids.values if isinstance(ids, tf.SparseTensor) else ids
        values = values.flat_values if isinstance(values, tf.RaggedTensor) else values
        seen.update(np.asarray(values).reshape(-1).tolist())
    out[f"{case}/seen"] = np.array(sorted(seen), np.int64)
    out[f"{case}/stored"] = np.sort(layer.embedding_variable.export()[0].numpy()).astype(np.int64)
    return model, layer, twin_model


def _evaluate_and_predict(facts, rng, model, layer, twin_model):
    before = {int(k): r for k, r in zip(*(t.numpy() for t in layer.embedding_variable.export()))}
    test = twins.batches(rng, "ragged", np.int64, 2, BATCH, N_ROWS)
    facts["evaluate"] = [
        float(model.evaluate(twins.as_dataset(test), verbose=0)),
        float(twin_model.evaluate(twins.as_dataset(test), verbose=0))
    ]
    predictions = [m.predict(twins.as_dataset(test), verbose=0) for m in (model, twin_model)]
    facts["predict"] = [p.reshape(-1).tolist() for p in predictions]
    after = {int(k): r for k, r in zip(*(t.numpy() for t in layer.embedding_variable.export()))}
    facts["trained_rows_unchanged"] = all(np.array_equal(after[k], r) for k, r in before.items())


def _refusals(facts, rng):
    for name, make in REFUSED.items():
        (model, layer), _, _, _ = _models(rng, "ragged", name=f"refused_{name}")
        optimizer = make()
        model.compile(optimizer=optimizer, loss="mse")
        data = twins.batches(rng, "ragged", np.int64, 2, BATCH, N_ROWS)
        try:
            model.fit(twins.as_dataset(data), verbose=0)
            message = "no error"
        except (TypeError, ValueError) as error:
            message = f"{type(error).__name__}: {error}"
        facts[f"refused/{name}"] = dict(message=message,
                                        layer=f"{layer.name}/embeddings",
                                        optimizer=type(optimizer).__name__,
                                        stored=int(layer.embedding_variable.total_count()),
                                        iterations=int(optimizer.iterations.numpy()))


def _table_state(layer):
    keys, rows, frequencies, versions, names, _ = (
        t.numpy() for t in layer.embedding_variable.export_full())
    order = np.argsort(keys)
    return dict(keys=keys[order].tolist(),
                rows=rows[order].tolist(),
                frequencies=frequencies[order].tolist(),
                versions=versions[order].tolist(),
                slots=sorted(n.decode() for n in names))


def _round_trip(facts, rng, how, directory):
    """Trains 3 steps of Adam, saves, restores into a model built fresh from
  the same code, and trains both 2 more steps."""
    matrix = twins.random_matrix(rng, N_ROWS, DIM)
    kernel = rng.normal(size=(DIM, 1)).astype(np.float32)
    data = twins.batches(rng, "ragged", np.int64, 5, BATCH, N_ROWS)
    (model, layer), _, _, _ = _models(rng, "ragged", matrix, kernel)
    model.compile(optimizer=twins.OPTIMIZERS["adam"](), loss="mse")
    path = os.path.join(directory, how)
    # ModelCheckpoint saves through save_weights at the end of the epoch.
    callbacks = ([tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)]
                 if how == "model_checkpoint" else [])
    model.fit(twins.as_dataset(data[:3]), verbose=0, callbacks=callbacks)
    (fresh, fresh_layer), _, _, _ = _models(rng, "ragged", matrix, kernel)
    fresh.compile(optimizer=twins.OPTIMIZERS["adam"](), loss="mse")
    if how in ("save_weights", "model_checkpoint"):
        if how == "save_weights":
            model.save_weights(path)
        fresh.load_weights(path)
    else:
        saved = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(path)
        tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(saved)
    result = dict(saved=_table_state(layer), restored=_table_state(fresh_layer))
    losses = []
    for m in (model, fresh):
        losses.append(m.fit(twins.as_dataset(data[3:]), verbose=0).history["loss"])
    result.update(after_saved=_table_state(layer),
                  after_restored=_table_state(fresh_layer),
                  losses=losses,
                  kernels=[model.head.kernel.numpy().tolist(),
                           fresh.head.kernel.numpy().tolist()],
                  iterations=[
                      int(model.optimizer.iterations.numpy()),
                      int(fresh.optimizer.iterations.numpy())
                  ])
    facts[f"round_trip/{how}"] = result


def _saved_model_and_hdf5(facts, rng, directory):
    """model.save(directory) read back by load_model predicts what the model
  does; HDF5 saves and loads are refused, leaving no file."""
    (model, _), _, _, _ = _models(rng, "dense_pooled", name="saved_table")
    model.compile(optimizer=twins.OPTIMIZERS["adagrad"](), loss="mse")
    data = twins.batches(rng, "dense_pooled", np.int64, 3, BATCH, N_ROWS)
    model.fit(twins.as_dataset(data), verbose=0)
    ids = data[0][0]
    saved_model = os.path.join(directory, "saved_model")
    model.save(saved_model)
    loaded = tf.keras.models.load_model(saved_model)
    facts["saved_model"] = dict(predicted=model.predict(ids, verbose=0).tolist(),
                                loaded=loaded.predict(ids, verbose=0).tolist())
    refusals = {}
    for verb, name in [("save", "m.h5"), ("save", "m.keras"), ("save_weights", "w.h5"),
                       ("save_weights", "w_fmt"), ("load_weights", "w.h5")]:
        path = os.path.join(directory, "hdf5", name)
        kwargs = dict(save_format="h5") if name == "w_fmt" else {}
        try:
            getattr(model, verb)(path, **kwargs)
            message = "no error"
        except ValueError as error:
            message = str(error)
        refusals[f"{verb}({name})"] = dict(message=message, file=os.path.exists(path))
    facts["hdf5_refusals"] = refusals


def main(path, seed):
    rng = np.random.default_rng(seed)
    sok_ev.init()
    facts = {"keras_layer_module": tf.keras.layers.Layer.__module__}
    out = {}
    for case in FITS:
        trained = _fit(out, case, rng)
        if case == "adagrad":
            _evaluate_and_predict(facts, rng, *trained)
    _refusals(facts, rng)
    directory = os.path.dirname(os.path.abspath(path))
    for how in ("save_weights", "model_checkpoint", "checkpoint"):
        _round_trip(facts, rng, how, directory)
    _saved_model_and_hdf5(facts, rng, directory)
    out["facts"] = np.array(json.dumps(facts))
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
