"""sok_ev.keras.DistributedOptimizer and BroadcastGlobalVariablesCallback on
one worker: bad arguments are refused naming the argument and the value, and
a marked optimizer on one worker is the optimizer it marks (same object,
nothing averaged). Several workers: tests/multiworker/test_keras_fit.py."""
import keras
import pytest


@pytest.mark.parametrize("value", ["adagrad", None, keras.optimizers.Adagrad])
def test_distributed_optimizer_refuses_what_is_not_a_keras_optimizer(sok, value):
    with pytest.raises(TypeError, match=r"DistributedOptimizer: optimizer must be .*got"):
        sok.keras.DistributedOptimizer(value)
    with pytest.raises(TypeError) as raised:
        sok.keras.DistributedOptimizer(value)
    assert repr(value) in str(raised.value)


def test_distributed_optimizer_returns_the_optimizer_it_marks(sok):
    optimizer = keras.optimizers.Adagrad(0.1)
    assert sok.keras.DistributedOptimizer(optimizer) is optimizer
    assert sok.keras_optimizers.is_data_parallel(optimizer)
    assert not sok.keras_optimizers.is_data_parallel(keras.optimizers.Adagrad(0.1))


@pytest.mark.parametrize("root_rank", [1, -1, True, "0", 0.0])
def test_broadcast_callback_refuses_a_root_rank_outside_the_workers(sok, root_rank):
    with pytest.raises(ValueError) as raised:
        sok.keras.BroadcastGlobalVariablesCallback(root_rank)
    assert "root_rank must be an int in [0, 1)" in str(raised.value)
    assert repr(root_rank) in str(raised.value)
