"""The rows' way back to their requesters, and its precision.

The one place that decides what `lookup_sparse(..., exchange_dtype=...)`
means (issue 12's compressed exchange). `sok_ev.distributed` calls
`exchange_and_combine` with its owners' lookup (OwnedRows), which this module
runs in the form the exchange wants; the rows then cross the network as one
message (FindOrInsertRowMessage, which writes each row where the message
wants it -> alltoall -> CombineRowMessage, which combines each sample's rows
where they arrived; compressed: FindOrInsertCombine -> PackRowMessage ->
alltoall -> UnpackRowMessage -> CombineForward; sok_ev/cc/ops/), and their
gradients the same way reversed.
The messages travel over the lookup's own NCCL communicator on GPUs
(sok_ev.communication.alltoall), told what arrives from whom by the counts
(RowMessageSplits), and over Horovod on CPUs or with
SOK_EV_ROW_TRANSPORT=horovod (sok_ev.communication.row_transport).
The rows a worker owns for its own keys (about 1/W of them, sharded) stay
out of the message: PackRowMessage hands them to the receiving op beside it,
as float32, so they are neither copied into the message nor exchanged, nor
rounded.

  float32   the rows and gradients travel exactly; the per-op gradients
            registered in sok_ev.distributed and sok_ev.lookup carry the
            backward pass.
  bfloat16  each element is rounded to bfloat16 (nearest, ties to even;
            NaN stays NaN; float32's range, only |x| > 3.3961e38 becomes
            inf) in both directions: half the bytes, relative error <= 2^-8
            per element (8 significant bits: half an ulp is 2^-8 of 1.0).
  float16   the same with float16: relative error <= 2^-11 for |x| in
            [2^-14, 65504]; |x| >= 65520 becomes inf, smaller values lose
            precision down to 2^-24 (|x| <= 2^-25 becomes 0: tiny gradients
            vanish, which bfloat16 keeps).

Rounding is the only change, and only for rows another worker owns: a
combined row of k received rows x_i is within
`RELATIVE_ERROR[dtype] * sum_i |w_i * x_i|` of its float32 value (times the
combiner's scale for mean / sqrtn), and the same holds for each gradient row
an owner receives.

The compressed message is 16-bit: uint16 (bfloat16 bits) or float16, and
TensorFlow does not differentiate through integer tensors. So the exchange is
one `tf.custom_gradient` function, whose gradient packs the incoming row
gradients compressed, sends them back and widens them again on the owner.
On the wire both 16-bit formats are typed float16 (a free bitcast): Horovod's
NCCL path has no 16-bit integer type, and an alltoall only moves the bits.
Every worker must pass the same exchange_dtype: the lookup's build-time
check (sok_ev.agreement.check_lookup) fails on every worker otherwise, naming
both values.
"""

from typing import NamedTuple

import tensorflow as tf

from sok_ev import communication
from sok_ev._ops import ops

EXCHANGE_DTYPES = (tf.float32, tf.bfloat16, tf.float16)

# Per-element relative rounding error of each exchange dtype (normal range).
RELATIVE_ERROR = {tf.float32: 0.0, tf.bfloat16: 2.0**-8, tf.float16: 2.0**-11}

# The row message ops' Tmessage for each exchange dtype.
_MESSAGE_DTYPE = {tf.float32: tf.float32, tf.bfloat16: tf.uint16, tf.float16: tf.float16}

# What an alltoall carries a 16-bit message as (see the module docstring).
_WIRE_DTYPE = tf.float16


def check_exchange_dtype(value, caller="lookup_sparse"):
    """The exchange dtype `value` names, as a tf.DType.

  Args:
    value: tf.float32, tf.bfloat16 or tf.float16, as a tf.DType or its name
      ("float32", "bfloat16", "float16").
    caller: the public function named in error messages.

  Returns:
    One of EXCHANGE_DTYPES.

  Raises:
    TypeError: `value` is neither a tf.DType nor a string.
    ValueError: `value` names another dtype, or none.
  """
    allowed = ", ".join(d.name for d in EXCHANGE_DTYPES)
    if not isinstance(value, (tf.DType, str)):
        raise TypeError(f"{caller}: exchange_dtype must be a tf.DType or a dtype name "
                        f"({allowed}), got {value!r} of type {type(value).__name__}")
    try:
        dtype = tf.as_dtype(value)
    except TypeError:
        dtype = None
    if dtype not in EXCHANGE_DTYPES:
        raise ValueError(f"{caller}: exchange_dtype must be one of {allowed}, got {value!r}")
    return dtype


class Combine(NamedTuple):
    """How the requester combines the rows of its unique keys: UniqueKeys'
  outputs (N tensors each) and lookup_sparse's combiners and weighted flags
  (N each)."""
    unique_index: list
    order: list
    segments: list
    row_offsets: list
    weights: list
    combiners: list
    weighted: list


class OwnedRows(NamedTuple):
    """An owner's lookup of the keys it received, in either of two forms.

  rows(): N float32 `[sum_w sender_counts[t, w], dims[t]]`, the rows of the
    received keys, worker 0's requests first (UnpackKeyMessage's order).
  row_message(local_worker): those rows already laid out as
    PackRowMessage(rows(), sender_counts, local_worker=local_worker) lays
    them out: (message float32, splits int32 [W], local: N float32).
  Both differentiable, with the same gradients reaching the tables."""
    rows: object
    row_message: object


def exchange_and_combine(owned,
                         sender_counts,
                         owner_counts,
                         positions,
                         dims,
                         exchange_dtype,
                         local_worker,
                         combine,
                         communicator=None):
    """Sends each owner's looked-up rows back to the workers that asked, and
  combines them there into each sample's embedding.

  Collective: every worker calls it with the same tables and exchange_dtype.
  The rows a worker owns for its own keys stay on it (float32, exact): the
  messages carry only the other workers' blocks. In float32 the owner looks
  its rows up straight into the message (OwnedRows.row_message) and the
  requester combines them where they arrive (CombineRowMessage): neither
  end copies them.

  Args:
    owned: an OwnedRows, the lookup of the rows this worker owns.
    sender_counts: int64 `[N, W]`, rows of table t requested by worker w.
    owner_counts: int64 `[N, W]`, rows of table t this worker asked of w.
    positions: N int64 vectors, where each received row goes in the
      requester's unique keys (PartitionByOwner's positions).
    dims: N embedding dims.
    exchange_dtype: one of EXCHANGE_DTYPES (check_exchange_dtype).
    local_worker: this worker's rank.
    combine: a Combine of this worker's batch.
    communicator: None (the messages go through Horovod), or the hex NCCL id
      of the lookup's native exchange (sok_ev.communication.alltoall).

  Returns:
    N float32 `[batch_t, dims[t]]`, differentiable with respect to the owned
    rows: the gradient travels back in `exchange_dtype` too.
  """
    combine_attrs = dict(combiners=combine.combiners, weighted=combine.weighted)
    if exchange_dtype == tf.float32:
        # Exact: the registered gradients of the ops (sok_ev.distributed,
        # sok_ev.lookup).
        send_rows, row_splits, local = owned.row_message(local_worker)
        returned = _alltoall_rows(send_rows, row_splits, owner_counts, dims, local_worker,
                                  communicator)
        return ops().sok_ev_combine_row_message(returned,
                                                owner_counts,
                                                positions,
                                                local,
                                                combine.unique_index,
                                                combine.order,
                                                combine.segments,
                                                combine.row_offsets,
                                                combine.weights,
                                                dims=dims,
                                                local_worker=local_worker,
                                                **combine_attrs)
    rows = _exchange_compressed(owned.rows(), sender_counts, owner_counts, positions, dims,
                                _MESSAGE_DTYPE[exchange_dtype], local_worker, communicator)
    return ops().sok_ev_combine_forward(rows, combine.unique_index, combine.order, combine.segments,
                                        combine.row_offsets, combine.weights, **combine_attrs)


def _alltoall_rows(message, splits, received_counts, dims, local_worker, communicator):
    """The row message every worker sent here: over Horovod, or over the
  lookup's NCCL communicator, whose receiving sizes come from
  `received_counts` ([N, W], the rows of table t worker w sends here)."""
    received_splits = None
    if communicator is not None:
        received_splits = ops().sok_ev_row_message_splits(received_counts,
                                                          dims=dims,
                                                          local_worker=local_worker)
    received, _ = communication.alltoall(message,
                                         splits,
                                         received_splits=received_splits,
                                         communicator=communicator)
    return received


def _exchange_compressed(values, sender_counts, owner_counts, positions, dims, message_dtype,
                         local_worker, communicator):
    """The rows of exchange_and_combine, unpacked in unique-key order, through
  16-bit messages both ways: N float32 `[num_unique_t, dims[t]]`."""
    n = len(values)

    def move(rows, counts, row_positions, received_counts, received_positions):
        message, splits, local = ops().sok_ev_pack_row_message(rows,
                                                               counts,
                                                               row_positions,
                                                               Tmessage=message_dtype,
                                                               local_worker=local_worker)
        received = _alltoall_rows(tf.bitcast(message, _WIRE_DTYPE), splits, received_counts, dims,
                                  local_worker, communicator)
        return ops().sok_ev_unpack_row_message(tf.bitcast(received, message_dtype),
                                               received_counts,
                                               received_positions,
                                               local,
                                               N=n,
                                               dims=dims,
                                               local_worker=local_worker)

    @tf.custom_gradient
    def exchange(*owned_rows):
        rows = move(list(owned_rows), sender_counts, [], owner_counts, positions)

        def grad(*grad_rows):
            grad_rows = [
                tf.zeros_like(r) if g is None else tf.convert_to_tensor(g)
                for g, r in zip(grad_rows, rows)
            ]
            return move(grad_rows, owner_counts, positions, sender_counts, [])

        return rows, grad

    return list(exchange(*values))
