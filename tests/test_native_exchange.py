"""The native GPU transport of the row messages (the default on GPUs,
SOK_EV_ROW_TRANSPORT=nccl): sok-ev's own NCCL all-to-all
(sok_ev/cc/ops/nccl_ops.cc) in one process.

Pinned down here, on one worker:
* the receiving end of a row message knows its splits from its counts alone
  (RowMessageSplits equals PackRowMessage's splits, NumPy's sums, the local
  worker's block left out), on any device;
* the rows of lookups on GPUs take it unless SOK_EV_ROW_TRANSPORT says
  otherwise, those on CPUs take Horovod; the transport's settings are
  checked, naming the variable and the value;
* on a GPU, NcclAlltoall over a one-worker communicator returns the rows it
  sent to itself, bit for bit, for every dtype the row messages use, rows of
  any width and none; its gradient is the reverse exchange; splits that do
  not match the tensor, and a malformed communicator, fail naming them; a
  second worker that never comes makes the exchange fail within its timeout.
Two or more workers: tests/multiworker/test_native_exchange_workers.py.
"""
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from sok_ev import communication
from sok_ev._ops import ops

GPU = bool(tf.config.list_physical_devices("GPU"))
needs_gpu = pytest.mark.skipif(not GPU, reason="NCCL carries GPU tensors; the device run has one")


@pytest.mark.parametrize("local_worker", [-1, 0, 2])
def test_row_message_splits_are_the_packed_messages_splits(rng, local_worker):
    workers, dims = 3, [4, 1, 16]
    counts = rng.integers(0, 5, size=(len(dims), workers)).astype(np.int64)
    counts[1] = 0  # a table nobody asked for
    rows = [
        rng.standard_normal((int(counts[t].sum()), d)).astype(np.float32)
        for t, d in enumerate(dims)
    ]
    splits = ops().sok_ev_row_message_splits(counts, dims=dims, local_worker=local_worker)
    _, packed_splits, _ = ops().sok_ev_pack_row_message(rows, counts, [], local_worker=local_worker)
    expected = (counts * np.array(dims)[:, None]).sum(axis=0)
    if local_worker >= 0:
        expected[local_worker] = 0
    np.testing.assert_array_equal(splits.numpy(), expected)
    np.testing.assert_array_equal(packed_splits.numpy(), expected)


def test_row_message_splits_refuse_counts_of_other_tables():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"counts must be \[2, num_workers\]"):
        ops().sok_ev_row_message_splits(np.zeros((3, 2), np.int64), dims=[4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"local_worker must be -1 or in"):
        ops().sok_ev_row_message_splits(np.zeros((1, 2), np.int64), dims=[4], local_worker=2)


def test_row_transport_is_nccl_on_gpus_and_horovod_on_cpus_unless_set(monkeypatch):
    monkeypatch.delenv(communication.ROW_TRANSPORT_VARIABLE, raising=False)
    assert communication.row_transport("/GPU:0") == "nccl"
    assert communication.row_transport("/job:localhost/replica:0/task:0/device:GPU:0") == "nccl"
    assert communication.row_transport("/CPU:0") == "horovod"
    monkeypatch.setenv(communication.ROW_TRANSPORT_VARIABLE, "horovod")
    assert communication.row_transport("/GPU:0") == "horovod"
    monkeypatch.setenv(communication.ROW_TRANSPORT_VARIABLE, "nccl")
    assert communication.row_transport("/CPU:0") == "nccl"  # refused by the lookup, naming it


def test_row_transport_names_a_wrong_value(monkeypatch):
    monkeypatch.setenv(communication.ROW_TRANSPORT_VARIABLE, "mpi")
    with pytest.raises(ValueError,
                       match=r"SOK_EV_ROW_TRANSPORT must be one of horovod, nccl, "
                       r"got 'mpi'"):
        communication.row_transport("/GPU:0")


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_exchange_timeout_must_be_a_positive_number(monkeypatch, value):
    monkeypatch.setenv(communication.EXCHANGE_TIMEOUT_VARIABLE, value)
    with pytest.raises(ValueError,
                       match=f"SOK_EV_EXCHANGE_TIMEOUT must be a positive number of "
                       f"seconds, got '{value}'"):
        communication.exchange_timeout()
    monkeypatch.setenv(communication.EXCHANGE_TIMEOUT_VARIABLE, "2.5")
    assert communication.exchange_timeout() == 2.5


def test_a_native_exchange_needs_the_receiving_splits():
    with pytest.raises(ValueError, match="needs received_splits"):
        communication.alltoall(tf.zeros([2]), [2], communicator="00" * 128)


@pytest.fixture(scope="module")
def one_worker_communicator():
    if not GPU:
        pytest.skip("NCCL carries GPU tensors; the device run has one")
    return communication.new_nccl_id()


def _self_exchange(tensor, communicator, splits=None, received_splits=None):
    rows = int(tensor.shape[0])
    with tf.device("/GPU:0"):
        return ops().sok_ev_nccl_alltoall(tensor, [rows] if splits is None else splits,
                                          [rows] if received_splits is None else received_splits,
                                          communicator=communicator,
                                          rank=0,
                                          world_size=1,
                                          timeout_seconds=30.0)


@needs_gpu
@pytest.mark.parametrize("dtype,shape", [(np.float32, (37, 128)), (np.float32, (1000,)),
                                         (np.int64, (19, 2)), (np.float16, (8, 3)),
                                         (np.uint16, (5, 7)), (np.float32, (0, 64))])
def test_one_worker_receives_exactly_what_it_sent_itself(one_worker_communicator, rng, dtype,
                                                         shape):
    if np.issubdtype(dtype, np.floating):
        values = rng.standard_normal(shape).astype(dtype)
    else:
        values = rng.integers(-2**15 if dtype != np.uint16 else 0, 2**15, size=shape).astype(dtype)
    received = _self_exchange(tf.constant(values), one_worker_communicator)
    assert received.device.endswith("GPU:0")
    assert received.dtype == values.dtype and tuple(received.shape) == shape
    np.testing.assert_array_equal(received.numpy(), values)


@needs_gpu
def test_the_gradient_is_the_reverse_exchange(one_worker_communicator, rng):
    values = tf.constant(rng.standard_normal((11, 16)).astype(np.float32))
    upstream = rng.standard_normal((11, 16)).astype(np.float32)
    with tf.GradientTape() as tape:
        tape.watch(values)
        received, _ = communication.alltoall(values, [11],
                                             received_splits=tf.constant([11], tf.int32),
                                             communicator=one_worker_communicator)
        loss = tf.reduce_sum(received * upstream)
    np.testing.assert_array_equal(tape.gradient(loss, values).numpy(), upstream)


@needs_gpu
def test_splits_that_do_not_cover_the_tensor_fail_naming_them(one_worker_communicator):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="splits sum to 3 rows, but tensor has 4"):
        _self_exchange(tf.zeros([4, 2]), one_worker_communicator, splits=[3])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"received_splits must have one entry per worker \(1\)"):
        _self_exchange(tf.zeros([4, 2]), one_worker_communicator, received_splits=[2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"splits\[0\] is negative: -1"):
        _self_exchange(tf.zeros([0, 2]), one_worker_communicator, splits=[-1], received_splits=[0])


@needs_gpu
def test_a_malformed_communicator_fails_naming_it():
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="communicator must be the hex of a "
                       "128-byte NCCL unique id"):
        _self_exchange(tf.zeros([1]), "abc")


_WORKER_THAT_NEVER_COMES = """
import sys, time
import tensorflow as tf
from sok_ev import communication
from sok_ev._ops import ops
started = time.monotonic()
try:
    with tf.device("/GPU:0"):
        ops().sok_ev_nccl_alltoall(tf.zeros([2]), [1, 1], [1, 1],
                                   communicator=communication.new_nccl_id(), rank=0,
                                   world_size=2, timeout_seconds=3.0)
except tf.errors.OpError as error:
    print("FAILED AFTER", round(time.monotonic() - started, 1), "S:", error.message, flush=True)
    import os
    os._exit(0)  # the thread still inside ncclCommInitRank is not joined
print("NO ERROR", flush=True)
"""


@needs_gpu
def test_a_worker_that_never_joins_fails_the_exchange_within_its_timeout():
    """Worker 0 of 2 runs the exchange; worker 1 never starts: the
  communicator is not made, and the op fails after timeout_seconds (3 s)
  naming the cause, instead of waiting forever."""
    run = subprocess.run([sys.executable, "-c", _WORKER_THAT_NEVER_COMES],
                         capture_output=True,
                         text=True,
                         timeout=120,
                         check=False)
    assert "FAILED AFTER" in run.stdout, run.stdout + run.stderr
    line = next(text for text in run.stdout.splitlines() if text.startswith("FAILED AFTER"))
    seconds = float(line.split()[2])
    assert 2.5 <= seconds < 30, line
    assert ("worker 0 of 2: the other workers did not join the NCCL communicator within 3"
            in line), line
    assert "SOK_EV_EXCHANGE_TIMEOUT" in line, line
