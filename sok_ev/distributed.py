"""Model parallelism: the grouped lookup over tables spread across workers.

Every worker feeds its own batch (data parallel); every table lives on its
owners (model parallel). `find_or_insert` is the exchange in the middle of
`sok_ev.lookup_sparse` when there is more than one worker. For the N tables
of one call, with W workers:

  unique_keys[N] --PartitionByOwner--> keys grouped by owner, counts [N, W]
    --alltoall #1 (int64 rows, all tables together)-->
  each owner: FindOrInsert of the keys it received, with its own tables
    --alltoall #2 (float32, all tables together, rows flattened)-->
  rows back in unique_keys order.

Placement (`EmbeddingVariable.target_gpu`): -1 shards a table by
`owner_of(key) = splitmix64(int64(key) XOR 0x5bd1e9955bd1e995) mod W`
(cc/partition.h; checkpoints depend on it); k keeps the whole table on k.

Only unique keys travel, once to their owner and back. Per worker and step,
with U its unique keys (over all tables, those owned elsewhere are what
crosses the network) and N tables, this worker sends
  16 * (U + W * N) bytes of keys, occurrence counts and headers,
  4 * U * dim bytes of rows back (and the same again for the gradients),
while an allgather design (SOK, HugeCTR's distributed-slot embedding) sends
every key to every worker and every sample's combined row through a
reduce-scatter: 8 * nnz * (W - 1) + 4 * batch * N * dim * (W - 1) bytes
(and the rows part again for the gradients).
benchmarks/cpu_weak_scaling.py measures both on a Criteo-like batch.

Backward is TensorFlow's autodiff over the same path: the float alltoall's
gradient is the reverse alltoall (Horovod registers it), the permutations are
gathers with gather gradients, and FindOrInsert's gradient gives each owner
IndexedSlices keyed by the keys it received, duplicates from several workers
included (the fused optimizer op sums them). Each owner then applies the
optimizer to its shard only: an Embedding Variable's gradient is never
allreduced (`sok_ev.embedding_gradients` refuses it; the keys each owner
looks up are marked here for that guard).

Message layout of alltoall #1, to each worker w: a header of N + 1 rows --
`(fingerprint of the lookup, N)` (sok_ev.agreement checks that every worker
runs the same lookup), then `(count of table t's keys for w, 0)` for each
table -- then table 0's `(key, occurrences)` rows for w, then table 1's,
... Alltoall #2 returns, to each requester, the rows of its keys in the same
(table, key) order, flattened to floats because the tables' dims differ.
"""

import tensorflow as tf

from sok_ev import agreement
from sok_ev import communication
from sok_ev import embedding_gradients
from sok_ev._ops import ops


def _exclusive_cumsum(x, axis=0):
    return tf.cumsum(x, axis=axis, exclusive=True)


def _segments(starts, lengths):
    """Indices of the blocks `[starts[i], starts[i] + lengths[i])`, in order."""
    starts = tf.reshape(starts, [-1])
    lengths = tf.reshape(lengths, [-1])
    return tf.ragged.range(starts, starts + lengths, dtype=tf.int64).flat_values


@tf.custom_gradient
def _permute(x, permutation):
    """`tf.gather(x, permutation)` for a permutation, with a dense gradient
  (a gather by the inverse permutation, not IndexedSlices)."""

    def grad(dy):
        return tf.gather(dy, tf.math.invert_permutation(permutation)), None

    return tf.gather(x, permutation), grad


def find_or_insert(params, unique_keys, counts):
    """The rows of every worker's unique keys, from the workers that own them.

  Collective: every worker must call it, with the same tables in the same
  order (checked when the lookup is built, and at run time by the header of
  the first exchange: sok_ev.agreement), each with its own keys (possibly
  none).

  Args:
    params: N Embedding Variables (this worker's shards).
    unique_keys: N 1-D key tensors (each table's key_dtype), unique per table.
    counts: N int64 tensors, occurrences of each unique key in the batch
      (added to the owner's key frequencies).

  Returns:
    N float32 tensors `[num_unique_t, embedding_dim_t]`, row j the value of
    `unique_keys[t][j]`; differentiable, the gradient reaching the owners'
    tables as IndexedSlices.

  Raises:
    ValueError: see `sok_ev.agreement.check_lookup`.
    tf.errors.InvalidArgumentError: at run time, another worker ran another
      lookup (sok_ev.agreement.check_headers).
  """
    agreement.check_lookup(params)
    n = len(params)
    size = communication.world_size()
    dims = [int(v.embedding_dim) for v in params]
    dims_tensor = tf.constant(dims, tf.int64)
    with tf.name_scope("sok_ev_distributed"):
        keys_by_owner, positions, owner_counts = ops().sok_ev_partition_by_owner(
            unique_keys, target_workers=[int(v.target_gpu) for v in params], num_workers=size, N=n)
        owner_counts = tf.reshape(owner_counts, [n, size])  # [table, owner]

        # Alltoall #1: to each worker, a header -- the lookup's fingerprint row,
        # then one (count of the table's keys for it, 0) row per table -- then the
        # (key, occurrences) rows, table by table. The source buffer is [headers
        # (owner, row); keys (table, owner)]; _segments picks its blocks in
        # sending order.
        header_rows = n + 1
        key_rows = tf.concat([
            tf.stack([tf.cast(k, tf.int64), tf.gather(c, p)], axis=1)
            for k, c, p in zip(keys_by_owner, counts, positions)
        ],
                             axis=0)
        count_rows = tf.stack(
            [tf.reshape(tf.transpose(owner_counts), [-1]),
             tf.zeros([size * n], tf.int64)], axis=1)
        headers = tf.reshape(
            tf.concat(
                [agreement.header(params, size)[:, None, :],
                 tf.reshape(count_rows, [size, n, 2])],
                axis=1), [size * header_rows, 2])
        source = tf.concat([headers, key_rows], axis=0)
        table_start = _exclusive_cumsum(tf.reduce_sum(owner_counts, axis=1))
        key_starts = (size * header_rows + table_start[:, None] +
                      _exclusive_cumsum(owner_counts, axis=1))  # [table, owner]
        header_starts = tf.range(size, dtype=tf.int64)[:, None] * header_rows
        starts = tf.concat([header_starts, tf.transpose(key_starts)], axis=1)
        lengths = tf.concat(
            [tf.fill([size, 1], tf.constant(header_rows, tf.int64)),
             tf.transpose(owner_counts)],
            axis=1)
        send_rows = tf.gather(source, _segments(starts, lengths))
        # Pinned to the device a stop message will use (sok_ev.agreement):
        # Horovod pairs a GPU alltoall only with GPU alltoalls.
        device = agreement.exchange_device(params)
        with tf.device(device):
            received, received_splits = communication.alltoall(
                send_rows,
                header_rows + tf.reduce_sum(owner_counts, axis=0),
                name=agreement.exchange_name(params, device),
                exact_name=True)

        # On the owner: every sender must run this lookup (its first header row),
        # before anything reads the rest; the other header rows give its per-table
        # counts; regroup the rows by table (then sender) for FindOrInsert.
        block_start = _exclusive_cumsum(tf.cast(received_splits, tf.int64))
        check = agreement.check_headers(params, tf.gather(received, block_start))
        with tf.control_dependencies([check]):
            received = tf.identity(received)
        from_counts = tf.reshape(
            tf.gather(
                received[:, 0],
                tf.reshape(block_start[:, None] + 1 + tf.range(n, dtype=tf.int64)[None, :], [-1])),
            [size, n])  # [sender, table]
        row_starts = (block_start[:, None] + header_rows + _exclusive_cumsum(from_counts, axis=1)
                     )  # [sender, table]
        by_table = tf.gather(received, _segments(tf.transpose(row_starts),
                                                 tf.transpose(from_counts)))
        received_per_table = tf.reduce_sum(from_counts, axis=0)
        table_rows = tf.split(by_table, received_per_table, num=n, axis=0)
        owned_keys = []
        for variable, rows in zip(params, table_rows):
            keys = tf.cast(rows[:, 0], variable.key_dtype)
            owned_keys.append(embedding_gradients.mark(keys, variable))
        values = ops().sok_ev_find_or_insert([v.handle for v in params],
                                             owned_keys, [rows[:, 1] for rows in table_rows],
                                             embedding_dims=dims)

        # Alltoall #2: the rows back, grouped by requester then table, as floats
        # (the tables' dims may differ). Rows move as blocks (split, concat):
        # an index per float would cost more than the rows themselves.
        by_sender = [tf.split(v, from_counts[:, t], num=size) for t, v in enumerate(values)]
        send_values = tf.concat(
            [tf.reshape(by_sender[t][w], [-1]) for w in range(size) for t in range(n)], axis=0)
        floats_from = from_counts * dims_tensor[None, :]  # [sender, table]
        returned, _ = communication.alltoall(send_values, tf.reduce_sum(floats_from, axis=1))

        # Back on the requester: each owner's block holds table 0's rows, then
        # table 1's, ...; regroup by table (then owner), un-permute.
        floats_to = owner_counts * dims_tensor[:, None]  # [table, owner]
        by_owner = tf.split(returned, tf.reshape(tf.transpose(floats_to), [-1]), num=size * n)
        unique_values = []
        for t, (dim, p) in enumerate(zip(dims, positions)):
            rows = tf.concat([tf.reshape(by_owner[w * n + t], [-1, dim]) for w in range(size)],
                             axis=0)
            unique_values.append(_permute(rows, tf.math.invert_permutation(p)))
        return unique_values
