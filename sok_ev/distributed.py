"""Model parallelism: the grouped lookup over tables spread across workers.

Every worker feeds its own batch (data parallel); every table lives on its
owners (model parallel). With more than one worker, `sok_ev.lookup_sparse`
after its UniqueKeys is `route_keys` (no table read) then `lookup_routed`;
sok_ev.LookupPipeline runs the first for the next batch while the second
runs for this one. For the N tables of one call, with W workers:

  route_keys:
  unique_keys[N] --PartitionByOwner--> keys grouped by owner, counts [N, W]
    --alltoall #1 (int64 rows, all tables together)-->
  each owner: UniqueOwnedKeys (a key asked by several workers once: the
    workers' sorted runs merged on the GPU);
  lookup_routed:
  each owner: FindOrInsertRowMessage: each key found once, and the row of
    every key received written where the message back to its sender wants it
    --alltoall #2 (float32, all tables together, rows flattened; or bfloat16 /
    float16 with lookup_sparse's exchange_dtype: sok_ev.row_exchange; the
    rows an owner looked up for itself go beside it, not through it; on
    GPUs over sok-ev's own NCCL communicator, one per lookup, made at its
    build-time check, on CPUs over Horovod: communication.row_transport)-->
  each requester combines its samples' rows where they arrived
  (CombineRowMessage).

Placement (`EmbeddingVariable.target_gpu`): -1 shards a table by
`owner_of(key) = splitmix64(int64(key) XOR 0x5bd1e9955bd1e995) mod W`
(cc/partition.h; checkpoints depend on it); k keeps the whole table on k.

Only unique keys travel, once to their owner and back. Per worker and step,
with U its unique keys (over all tables, those owned elsewhere are what
crosses the network) and N tables, this worker sends
  16 * (U + W * N) bytes of keys, occurrence counts and headers,
  4 * U' * dim bytes of rows back, U' the keys other workers asked it for
  (and the same again for the gradients),
while an allgather design (SOK, HugeCTR's distributed-slot embedding) sends
every key to every worker and every sample's combined row through a
reduce-scatter: 8 * nnz * (W - 1) + 4 * batch * N * dim * (W - 1) bytes
(and the rows part again for the gradients).
benchmarks/cpu_weak_scaling.py measures both on a Criteo-like batch.

Backward is TensorFlow's autodiff over the same path: the row messages'
gradients are the reverse messages (registered below and in
sok_ev.lookup), and FindOrInsertRowMessage's gradient
(FindOrInsertRowMessageGrad) sums each owned key's gradients from every
worker that asked for it, read where the gradient message arrived, so each
owner gets IndexedSlices keyed by its distinct keys. Each owner then applies the
optimizer to its shard only: an Embedding Variable's gradient is never
allreduced (`sok_ev.embedding_gradients` refuses it; the keys each owner
looks up are marked here for that guard).

The messages are built and read by one op per end for all tables
(sok_ev/cc/ops/exchange_ops.cc; layout in cc/exchange_message.h), so a
step's op count does not grow with tables times workers. Alltoall #1, to each
worker w: a header of N + 1 rows -- `(fingerprint of the lookup, N)`
(sok_ev.agreement: UnpackKeyMessage fails unless every worker runs the same
lookup), then `(count of table t's keys for w, 0)` for each table -- then
table 0's `(key, occurrences)` rows for w, then table 1's, ... Alltoall #2
returns, to each requester, the rows of its keys in the same (table, key)
order, flattened to floats because the tables' dims differ.
"""

from typing import NamedTuple

import tensorflow as tf

from sok_ev import agreement
from sok_ev import communication
from sok_ev import embedding_gradients
from sok_ev import exchange_watch
from sok_ev import row_exchange
from sok_ev._ops import ops


class KeyRouting(NamedTuple):
    """A batch's unique keys routed to their owners: every tensor the row
  exchange needs (route_keys' output; sok_ev.LookupPipeline stages it
  between steps).

  positions: N int64 vectors, where each row returned by an owner goes in
    this worker's unique keys (PartitionByOwner's).
  owner_counts: int64 `[N, W]`, rows of table t this worker asks of w
    (read on the host).
  owned: what this worker owns of every worker's keys, UniqueOwnedKeys'
    outputs (N each): unique_keys, unique_counts, unique_index, order,
    segments, row_offsets.
  sender_counts: int64 `[N, W]`, keys of table t worker w sent here (host
    memory).
  """
    positions: list
    owner_counts: tf.Tensor
    owned: tuple
    sender_counts: tf.Tensor


# KeyRouting's fields the row stages read on the host.
HOST_FIELDS = ("owner_counts", "sender_counts")


def route_keys(params,
               unique_keys,
               counts,
               exchange_dtype=tf.float32,
               combiners=None,
               weighted=None):
    """Sends each unique key to the worker that owns it (the key exchange), and
  deduplicates what every owner received.

  Collective: every worker must call it, with the same tables in the same
  order (checked when the lookup is built, and at run time by the header of
  the key exchange: sok_ev.agreement), each with its own keys (possibly
  none). Reads no table.

  Args:
    params: N Embedding Variables (this worker's shards).
    unique_keys: N 1-D key tensors (each table's key_dtype), unique per table.
    counts: N int64 tensors, occurrences of each unique key in the batch
      (added to the owner's key frequencies when it looks them up).
    exchange_dtype: what the rows will travel as (sok_ev.row_exchange); part
      of the lookup's fingerprint.
    combiners, weighted: N each (or None), how each worker will combine its
      samples' rows; checked to be the same on every worker.

  Returns:
    (KeyRouting, communicator): communicator is None (rows over Horovod) or
    the hex NCCL id of the lookup's native row exchange.

  Raises:
    ValueError: see `sok_ev.agreement.check_lookup`; or
      SOK_EV_ROW_TRANSPORT=nccl for tables whose exchange runs on the CPU.
    tf.errors.InvalidArgumentError: at run time, another worker ran another
      lookup or stopped the job (the header check of UnpackKeyMessage).
  """
    exchange_dtype_name = tf.as_dtype(exchange_dtype).name
    # Pinned to the device a stop message will use (sok_ev.agreement):
    # Horovod pairs a GPU alltoall only with GPU alltoalls.
    device = agreement.exchange_device(params)
    transport = communication.row_transport(device)
    if transport == "nccl" and "GPU" not in device:
        raise ValueError(f"lookup_sparse: {communication.ROW_TRANSPORT_VARIABLE}=nccl carries "
                         f"rows between GPUs, but the lookup of {[v.name for v in params]} "
                         f"exchanges on {device}; unset it for tables on the CPU")
    communicator = agreement.check_lookup(params,
                                          exchange_dtype_name,
                                          transport,
                                          combiners=combiners,
                                          weighted=weighted)
    size = communication.world_size()
    fingerprint = agreement.fingerprint(params, exchange_dtype_name)
    with tf.name_scope("sok_ev_route_keys"):
        keys_by_owner, positions, owner_counts = ops().sok_ev_partition_by_owner(
            unique_keys,
            target_workers=[int(v.target_gpu) for v in params],
            num_workers=size,
            N=len(params))
        send_keys, key_splits = ops().sok_ev_pack_key_message(keys_by_owner,
                                                              counts,
                                                              positions,
                                                              owner_counts,
                                                              fingerprint=fingerprint)
        name = agreement.exchange_name(params, device)
        # In a tf.Graph, a wait here past the time limit stops the job
        # (a lookup some workers run and others do not).
        watched = exchange_watch.watched_in_graph()
        if watched:
            call = exchange_watch.started(
                name, f"{[v.name for v in params]} ({agreement.describe_site()})")
        with tf.device(device), tf.control_dependencies([call] if watched else []):
            received_keys, received_splits = communication.alltoall(send_keys,
                                                                    key_splits,
                                                                    name=name,
                                                                    exact_name=True)
        arrived = [exchange_watch.ended(call, received_keys)] if watched else []
        # On the owner: fails unless every sender runs this lookup (its header),
        # before anything reads the rest.
        with tf.control_dependencies(arrived):
            owned_keys, owned_counts, sender_counts = ops().sok_ev_unpack_key_message(
                received_keys,
                received_splits,
                Tkeys=[v.key_dtype for v in params],
                N=len(params),
                fingerprint=fingerprint,
                table_names=[v.name for v in params])
        # A key several workers asked for arrives once from each: found once,
        # and its gradients summed once here (FindOrInsertRowMessageGrad), so the
        # optimizer gets distinct keys. Each worker's keys come as one sorted
        # run (sender_counts), which the GPU merges.
        owned = ops().sok_ev_unique_owned_keys(owned_keys, owned_counts, sender_counts)
    return KeyRouting(list(positions), owner_counts, tuple(list(o) for o in owned),
                      sender_counts), communicator


def lookup_routed(params, routing, combine, communicator=None, exchange_dtype=tf.float32):
    """Each sample's embeddings, from the rows of routed keys: every owner
  looks its keys up and sends their rows back (the row exchange), and each
  worker combines the rows of its samples.

  Collective, like route_keys, whose outputs it takes (routing,
  communicator): every worker calls it with the same tables, for the batch
  it routed.

  Args:
    params: N Embedding Variables (this worker's shards).
    routing: a KeyRouting of this worker's batch (route_keys).
    combine: a sok_ev.row_exchange.Combine of the same batch.
    communicator: route_keys' communicator.
    exchange_dtype: what the rows and their gradients travel as
      (sok_ev.row_exchange: float32 exact, bfloat16 or float16 rounded).

  Returns:
    N float32 tensors `[batch_t, embedding_dim_t]`, as lookup_sparse returns
    them; differentiable, the gradient reaching the owners' tables as
    IndexedSlices.
  """
    dims = [int(v.embedding_dim) for v in params]
    with tf.name_scope("sok_ev_distributed"):
        unique_keys, *rest = routing.owned
        unique_keys = [embedding_gradients.mark(k, v) for k, v in zip(unique_keys, params)]
        # One entry per received key, summed: each gets its key's row.
        owned = (unique_keys, *rest)
        handles = [v.handle for v in params]

        def owned_rows():
            return ops().sok_ev_find_or_insert_combine(handles,
                                                       *owned,
                                                       [tf.zeros([0], tf.float32)] * len(params),
                                                       embedding_dims=dims,
                                                       combiners=["sum"] * len(params),
                                                       weighted=[False] * len(params))

        def owned_row_message(local_worker):
            return ops().sok_ev_find_or_insert_row_message(handles,
                                                           *owned,
                                                           routing.sender_counts,
                                                           embedding_dims=dims,
                                                           local_worker=local_worker)

        return row_exchange.exchange_and_combine(
            row_exchange.OwnedRows(owned_rows, owned_row_message),
            routing.sender_counts, routing.owner_counts, routing.positions, dims, exchange_dtype,
            communication.rank(), combine, communicator)


@tf.RegisterGradient("SokEv>PackRowMessage")
def _pack_row_message_grad(op, grad_message, unused_grad_splits, *grad_local):
    """The rows' gradient: the message's gradient and the local rows'
  gradients read back into tables."""
    n = int(op.get_attr("N"))
    local_worker = op.get_attr("local_worker")
    rows, counts, positions = op.inputs[:n], op.inputs[n], list(op.inputs[n + 1:])
    local = [] if local_worker < 0 else [
        tf.zeros_like(out) if g is None else g for g, out in zip(grad_local, op.outputs[2:])
    ]
    grads = ops().sok_ev_unpack_row_message(grad_message,
                                            counts,
                                            positions,
                                            local,
                                            N=n,
                                            dims=[int(r.shape[1]) for r in rows],
                                            local_worker=local_worker)
    return list(grads) + [None] * (1 + len(positions))


@tf.RegisterGradient("SokEv>UnpackRowMessage")
def _unpack_row_message_grad(op, *grad_rows):
    """The message's gradient: the rows' gradients packed as the message was,
  and the local rows' gradients."""
    counts = op.inputs[1]
    num_positions, num_local = op.get_attr("P"), op.get_attr("L")
    positions = list(op.inputs[2:2 + num_positions])
    grad_message, _, grad_local = ops().sok_ev_pack_row_message(
        list(grad_rows),
        counts,
        positions,
        Tmessage=op.get_attr("Tmessage"),
        local_worker=op.get_attr("local_worker"))
    return [grad_message, None] + [None] * num_positions + list(grad_local)[:num_local]


@tf.RegisterGradient("SokEv>FindOrInsertRowMessage")
def _find_or_insert_row_message_grad(op, grad_message, unused_grad_splits, *grad_local):
    """Each table gets IndexedSlices keyed by the owner's unique keys: every
  received key's gradient, summed per key, read where the gradient message
  and the local rows' gradients arrived."""
    n = int(op.get_attr("N"))
    local_worker = op.get_attr("local_worker")
    # inputs: resources, unique_keys, counts, unique_index, order, segments,
    # row_offsets (N each), sender_counts
    if grad_message is None:
        grad_message = tf.zeros_like(op.outputs[0])
    local = [] if local_worker < 0 else [
        tf.zeros_like(out) if g is None else g for g, out in zip(grad_local, op.outputs[2:])
    ]
    grad_unique = ops().sok_ev_find_or_insert_row_message_grad(
        grad_message,
        op.inputs[7 * n],
        local,
        *[op.inputs[i * n:(i + 1) * n] for i in range(3, 7)],
        dims=op.get_attr("embedding_dims"),
        local_worker=local_worker)
    keys = op.inputs[n:2 * n]
    return [embedding_gradients.keyed_gradient(g, k, after=op) for g, k in zip(grad_unique, keys)
           ] + [None] * (6 * n + 1)


tf.no_gradient("SokEv>PackKeyMessage")
tf.no_gradient("SokEv>UnpackKeyMessage")
tf.no_gradient("SokEv>FindOrInsertRowMessageGrad")
