"""sok_ev.keras layers in tf_keras models (TF_USE_LEGACY_KERAS=1), trained
by tf_keras's compile/fit.

The variable must be set before TensorFlow is imported, so the models train
in a subprocess (tests/tf_keras_fit_worker.py) with this suite's sok_ev
first on its path; this module checks what it wrote.

The reference is the same model built on tf_keras's keras.layers.Embedding
holding the same rows (tests/keras_twins.py), compiled with the same
optimizer and fed the same batches: after every callback step the table's
rows, the dense head's kernel, the loss, the step Keras reports and the
optimizer's iterations must agree. Batches have duplicate ids, empty rows
(ragged, sparse), int32 and int64 ids; Adam and Ftrl batches look up every
row (Keras moves a dense variable's rows outside the batch under them; sok-ev
is lazy), SGD and Adagrad batches leave rows out, which must stay out.

Pinned down: the four supported optimizers step for step, steps_per_execution
3 (callbacks at steps 3 and 6), evaluate and predict, the refusal of other
optimizers (naming the optimizer and the table, nothing stored, no step
counted), and model.save_weights (TensorFlow format), ModelCheckpoint and
tf.train.Checkpoint round trips: keys, rows, slots, frequencies and versions,
then training on alike; a SavedModel directory loaded back predicting alike;
HDF5 and .keras files refused naming the table, leaving no file.
"""
import os

import numpy as np
import pytest

import sok_ev_reference as ref

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_keras_fit_worker.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """What the worker wrote: arrays and the json facts."""
    return ref.legacy_keras_facts(tmp_path_factory, WORKER, 52, "the tf_keras fit worker failed")


def test_the_layers_are_tf_keras_layers_under_legacy_keras(run):
    assert run[1]["keras_layer_module"].startswith("tf_keras.")


@pytest.mark.parametrize("case", ["sgd", "adagrad", "adam", "ftrl"])
def test_fit_equals_the_tf_keras_embedding_model_step_for_step(run, case):
    arrays, _ = run
    ref.assert_same_steps(arrays, case, "sok", "twin")
    rows = arrays[f"{case}/sok/rows"]
    assert not np.allclose(rows[0], rows[-1]), "training did not move the table"
    assert not np.allclose(rows[0], arrays[f"matrix/{case}"])


@pytest.mark.parametrize("case", ["sgd", "adagrad"])
def test_fit_inserts_and_moves_only_the_rows_it_looked_up(run, case):
    arrays, _ = run
    seen = arrays[f"{case}/seen"]
    unseen = sorted(set(range(len(arrays[f"matrix/{case}"]))) - set(seen.tolist()))
    assert unseen, "the batches looked up every row: nothing to check"
    np.testing.assert_array_equal(arrays[f"{case}/stored"], seen)
    np.testing.assert_array_equal(arrays[f"{case}/sok/rows"][-1][unseen],
                                  arrays[f"matrix/{case}"][unseen])


@pytest.mark.parametrize("case", ["adagrad_steps_per_execution", "adam_steps_per_execution"])
def test_fit_with_steps_per_execution_equals_the_twin_and_callbacks_see_each_execution(run, case):
    arrays, _ = run
    ref.assert_same_steps(arrays, case, "sok", "twin")
    # tf_keras calls back once per execution of 3 steps, with its last step.
    np.testing.assert_array_equal(arrays[f"{case}/sok/batch"], [2, 5])
    np.testing.assert_array_equal(arrays[f"{case}/sok/iterations"], [3, 6])


def test_evaluate_and_predict_equal_the_twin_and_leave_trained_rows_alone(run):
    facts = run[1]
    sok_loss, twin_loss = facts["evaluate"]
    assert sok_loss == pytest.approx(twin_loss, rel=1e-5)
    np.testing.assert_allclose(facts["predict"][0], facts["predict"][1], rtol=1e-5, atol=1e-6)
    assert facts["trained_rows_unchanged"]


@pytest.mark.parametrize("refused", ["Adadelta", "Adamax"])
def test_an_unsupported_optimizer_is_refused_naming_it_and_the_table_before_anything_changes(
        run, refused):
    result = run[1][f"refused/{refused}"]
    assert result["message"] != "no error"
    assert ref.error_names(result["message"], result["optimizer"], result["layer"])
    assert result["stored"] == 0 and result["iterations"] == 0


@pytest.mark.parametrize("how", ["save_weights", "model_checkpoint", "checkpoint"])
def test_saving_restores_the_table_with_slots_and_training_continues_identically(run, how):
    result = run[1][f"round_trip/{how}"]
    saved, restored = result["saved"], result["restored"]
    assert saved["slots"] == ["Adam/m", "Adam/v"]
    assert saved["keys"], "nothing was trained"
    assert restored == saved
    assert result["iterations"] == [5, 5]
    assert result["losses"][0] == result["losses"][1]
    assert result["kernels"][0] == result["kernels"][1]
    assert result["after_restored"] == result["after_saved"]
    assert result["after_saved"]["rows"] != saved["rows"], "the last fit did not train"


def test_a_saved_model_directory_loads_back_predicting_what_the_model_did(run):
    result = run[1]["saved_model"]
    np.testing.assert_array_equal(result["loaded"], result["predicted"])


@pytest.mark.parametrize("call", [
    "save(m.h5)", "save(m.keras)", "save_weights(w.h5)", "save_weights(w_fmt)", "load_weights(w.h5)"
])
def test_hdf5_files_are_refused_naming_the_table_and_what_saves_it_leaving_no_file(run, call):
    result = run[1]["hdf5_refusals"][call]
    assert "saved_table" in result["message"], result["message"]
    assert "tf.train.Checkpoint(model=model)" in result["message"]
    assert "model.save('<directory>')" in result["message"]
    assert not result["file"]
