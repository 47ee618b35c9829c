"""The many-worker lookup's two messages (sok_ev/cc/ops/exchange_ops.cc).

Pinned down, against NumPy slicing of the layout in cc/exchange_message.h,
with W workers simulated in one process (the all-to-all is NumPy: block w of
every sender's message, in sender order), int32 and int64 tables side by
side, empty tables and empty blocks:
* the keys message carries every (key, occurrences) row to its owner, grouped
  by table then sender, and the owner learns how many came from whom;
* the owner deduplicates what it received (UniqueOwnedKeys): each key once,
  its occurrences summed over the workers that sent it, every received key
  its own sample, its entries grouped by key in arrival order;
* the header check fails, naming the cause, when a worker sent "stopped" or
  another lookup's fingerprint, before any key is read;
* the rows message moves rows table by table and back, and with positions
  scatters them into place: unpack(pack(x)) == x;
* the local worker's block (a worker's rows for itself) stays out of the
  message and travels beside it, float32 even when the message is 16-bit;
* the gradients of pack and unpack are each other (checked against NumPy);
* combining a received message in place (CombineRowMessage) gives the bits
  of unpacking it and combining the rows, and NumPy's combination; its
  gradient is each unique key's gradient packed as the message was, written
  in place (CombineRowMessageGrad) with the bits of CombineBackward then
  PackRowMessage;
* the owner looks the keys it received up straight into the rows message
  back (FindOrInsertRowMessage) with the bits, splits and local block of
  FindOrInsertCombine then PackRowMessage, each key found once with its
  occurrences from every worker counted, filtered tables as admission
  decides; its gradient reads the gradient message in place
  (FindOrInsertRowMessageGrad) with the bits of UnpackRowMessage then
  CombineBackward, and trains each unique key with the sum of its received
  rows' gradients;
* malformed counts, rows or messages fail with an error naming them, an
  owner's lookup before any table changes.
"""
import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref
from sok_ev import distributed  # pylint: disable=unused-import  (the messages' gradients)
from sok_ev._ops import ops

FINGERPRINT = 123456789


def _alltoall(messages, splits):
    """What each worker receives: block w of every sender's message, in sender
  order, and the row counts of those blocks."""
    received, received_splits = [], []
    for w in range(len(messages)):
        blocks, sizes = [], []
        for message, split in zip(messages, splits):
            start = int(np.sum(split[:w]))
            blocks.append(message[start:start + split[w]])
            sizes.append(split[w])
        received.append(np.concatenate(blocks))
        received_splits.append(np.array(sizes, np.int32))
    return received, received_splits


def _random_tables(rng, dtypes, max_keys=40):
    """Per table: unique keys (some tables empty) and their occurrences."""
    keys, counts = [], []
    for dtype in dtypes:
        n = int(rng.integers(0, max_keys)) if rng.random() > 0.2 else 0
        table_keys = rng.choice(np.arange(-1000, 1000), size=n, replace=False).astype(dtype)
        keys.append(tf.constant(table_keys))
        counts.append(tf.constant(rng.integers(1, 5, size=n), tf.int64))
    return keys, counts


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_key_message_delivers_each_key_and_its_occurrences_to_its_owner(num_workers):
    rng = np.random.default_rng(num_workers)
    dtypes = [np.int64, np.int32, np.int64]
    targets = [-1, -1, num_workers - 1]  # the last table lives whole on the last worker
    sent, splits, expected = [], [], []
    for _ in range(num_workers):
        keys, counts = _random_tables(rng, dtypes)
        by_owner, positions, owner_counts = ops().sok_ev_partition_by_owner(keys,
                                                                            target_workers=targets,
                                                                            num_workers=num_workers,
                                                                            N=len(keys))
        message, split = ops().sok_ev_pack_key_message(by_owner,
                                                       counts,
                                                       positions,
                                                       owner_counts,
                                                       fingerprint=FINGERPRINT)
        sent.append(message.numpy())
        splits.append(split.numpy())
        # Reference: table t's keys for owner w are its by-owner block w.
        per_owner = []
        for t in range(len(keys)):
            bounds = np.concatenate([[0], np.cumsum(owner_counts.numpy()[t])])
            occurrences = counts[t].numpy()[positions[t].numpy()]
            per_owner.append([(by_owner[t].numpy()[bounds[w]:bounds[w + 1]],
                               occurrences[bounds[w]:bounds[w + 1]]) for w in range(num_workers)])
        expected.append(per_owner)
        assert split.dtype == tf.int32
        np.testing.assert_array_equal(split.numpy(),
                                      len(keys) + 1 + owner_counts.numpy().sum(axis=0))
    received, received_splits = _alltoall(sent, splits)
    for owner in range(num_workers):
        keys, counts, sender_counts = ops().sok_ev_unpack_key_message(
            received[owner],
            received_splits[owner],
            Tkeys=[tf.as_dtype(d) for d in dtypes],
            N=len(dtypes),
            fingerprint=FINGERPRINT,
            table_names=["a", "b", "c"])
        for t, dtype in enumerate(dtypes):
            want_keys = np.concatenate([expected[s][t][owner][0] for s in range(num_workers)])
            want_counts = np.concatenate([expected[s][t][owner][1] for s in range(num_workers)])
            assert keys[t].dtype == tf.as_dtype(dtype)
            np.testing.assert_array_equal(keys[t].numpy(), want_keys)
            np.testing.assert_array_equal(counts[t].numpy(), want_counts)
            np.testing.assert_array_equal(
                sender_counts.numpy()[t],
                [len(expected[s][t][owner][0]) for s in range(num_workers)])
        if owner != num_workers - 1:
            assert keys[2].shape[0] == 0  # the placed table's keys all go to its worker


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("blocks_sorted", [True, False])
def test_owned_keys_are_deduplicated_with_their_occurrences_summed(num_workers, blocks_sorted):
    # What an owner receives: each worker's unique keys, one after another, so
    # a key several workers asked for arrives once from each. A GPU worker
    # sends them sorted (its UniqueKeys sorts), which the GPU owner merges;
    # blocks in any other order are sorted, to the same result.
    rng = np.random.default_rng(10 + num_workers)
    dtypes = [np.int64, np.int32, np.int64]
    received_keys, received_counts = [], []
    sender_counts = np.zeros([len(dtypes), num_workers], np.int64)
    for t, dtype in enumerate(dtypes):
        # Table 0 is empty, and first among the int64 tables: its occurrences
        # are a null pointer, the other int64 table's are not.
        blocks = [
            rng.choice(np.arange(-30, 30), size=int(rng.integers(0, 25)), replace=False)
            for _ in range(num_workers)
        ] if t != 0 else [np.zeros([0], np.int64)] * num_workers
        if blocks_sorted:
            blocks = [np.sort(b) for b in blocks]
        sender_counts[t] = [len(b) for b in blocks]
        received_keys.append(np.concatenate(blocks).astype(dtype))
        received_counts.append(rng.integers(1, 6, size=len(received_keys[-1])).astype(np.int64))
    (unique_keys, counts, unique_index, order, segments,
     row_offsets) = ops().sok_ev_unique_owned_keys([tf.constant(k) for k in received_keys],
                                                   [tf.constant(c) for c in received_counts],
                                                   sender_counts)
    for t, (keys, occurrences) in enumerate(zip(received_keys, received_counts)):
        uniq, index = unique_keys[t].numpy(), unique_index[t].numpy()
        assert unique_keys[t].dtype == tf.as_dtype(dtypes[t])
        if "GPU" in unique_keys[t].device:  # sorted, or merged: ascending either way
            np.testing.assert_array_equal(uniq, np.unique(keys))
        np.testing.assert_array_equal(np.sort(uniq), np.unique(keys))
        np.testing.assert_array_equal(uniq[index], keys)
        want_counts = np.zeros(len(uniq), np.int64)
        np.add.at(want_counts, index, occurrences)
        np.testing.assert_array_equal(counts[t].numpy(), want_counts)
        np.testing.assert_array_equal(row_offsets[t].numpy(), np.arange(len(keys) + 1))
        bounds = segments[t].numpy()
        np.testing.assert_array_equal(np.diff(bounds), np.bincount(index, minlength=len(uniq)))
        assert bounds[0] == 0 and bounds[-1] == len(keys)
        if "GPU" in order[t].device:  # the GPU's backward reads the entries grouped by key
            entries = order[t].numpy()
            for u in range(len(uniq)):
                np.testing.assert_array_equal(entries[bounds[u]:bounds[u + 1]],
                                              np.flatnonzero(index == u))
        else:  # the CPU's reads unique_index
            assert order[t].shape == (0,)


def test_owned_keys_with_a_count_missing_fail_naming_the_occurrences():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"occurrences\[0\] must have shape"):
        ops().sok_ev_unique_owned_keys([tf.constant([3, 4, 3], tf.int64)],
                                       [tf.constant([1, 1], tf.int64)], [[2, 1]])


@pytest.mark.parametrize("sender_counts, message", [
    ([[2, 2]], r"sender_counts\[0\] sums to 4 keys, but keys\[0\] has 3"),
    ([[4, -1]], r"sender_counts\[0, 1\] is negative: -1"),
    ([3], r"sender_counts must be \[1, num_workers\], got shape \[1\]"),
    (np.zeros([1, 0], np.int64), r"sender_counts must be \[1, num_workers\], got shape \[1,0\]"),
])
def test_owned_keys_whose_sender_counts_do_not_split_them_fail_naming_the_counts(
        sender_counts, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ops().sok_ev_unique_owned_keys([tf.constant([3, 4, 3], tf.int64)],
                                       [tf.constant([1, 1, 1], tf.int64)],
                                       tf.constant(sender_counts, tf.int64))


def _header_message(headers):
    """A received keys message of one header row block per worker."""
    rows = np.concatenate([np.array(h, np.int64).reshape(-1, 2) for h in headers])
    return rows, np.array([len(h) for h in headers], np.int32)


def _unpack_one_table(message, splits):
    """UnpackKeyMessage of a one-table lookup (table 't0', int64 keys)."""
    return ops().sok_ev_unpack_key_message(message,
                                           splits,
                                           Tkeys=[tf.int64],
                                           N=1,
                                           fingerprint=FINGERPRINT,
                                           table_names=["t0"])


def test_a_stopped_header_fails_naming_the_stop_before_the_keys_are_read():
    good = [[FINGERPRINT, 1], [1, 0], [7, 3]]  # 1 table, 1 key (7, three times)
    message, splits = _header_message([good, [[-1, 0]]])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="another worker stopped this "
                       "exchange.*see worker 1's error"):
        _unpack_one_table(message, splits)


def test_another_lookups_header_fails_naming_the_tables_and_the_worker():
    good = [[FINGERPRINT, 1], [0, 0]]
    other = [[FINGERPRINT + 1, 2], [0, 0], [0, 0]]
    message, splits = _header_message([good, other])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"different lookups.*looked up \['t0'\] \(fingerprint 123456789, "
                       r"1 tables\) but worker 1 sent fingerprint 123456790 \(2 tables\)"):
        _unpack_one_table(message, splits)


@pytest.mark.parametrize("splits, error",
                         [([3, 3], "splits sum to 6 rows, but the message has 5"),
                          ([0, 5], "worker 0 sent no header"),
                          ([2, 3], "worker 0's header counts 3 rows, but it sent 2")])
def test_a_malformed_keys_message_fails_naming_what_is_wrong(splits, error):
    message, _ = _header_message([[FINGERPRINT, 1], [1, 0], [FINGERPRINT, 1], [1, 0], [5, 1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=error):
        _unpack_one_table(message, np.array(splits, np.int32))


def _row_case(rng, num_workers, dims, most=6):
    counts = rng.integers(0, most, size=(len(dims), num_workers))
    counts[0, :] = 0  # a table with no rows at all
    rows = [rng.standard_normal((int(c.sum()), d)).astype(np.float32) for c, d in zip(counts, dims)]
    positions = [rng.permutation(len(r)).astype(np.int64) for r in rows]
    return counts.astype(np.int64), rows, positions


def _block(counts, t, w, positions=None):
    """Table t's row indices of worker w's block."""
    first = int(counts[t, :w].sum())
    index = np.arange(first, first + counts[t, w])
    return index if positions is None else positions[t][index]


def _pack_reference(counts, rows, positions=None, local_worker=-1):
    """Worker by worker, table by table, the blocks' rows flattened; the
  local worker's block left out."""
    pieces = [np.zeros([0], np.float32)]
    for w in range(counts.shape[1]):
        if w == local_worker:
            continue
        for t, table in enumerate(rows):
            pieces.append(table[_block(counts, t, w, positions)].reshape(-1))
    return np.concatenate(pieces)


# Rows of any width, and rows of whole 16-byte vectors at 16-byte offsets
# (which the GPU copies as float4s).
ROW_WIDTHS = {"any_width": ([3, 8, 1, 5], 6), "float4_rows": ([4, 8, 128], 300)}


@pytest.mark.parametrize("widths", sorted(ROW_WIDTHS))
@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_row_message_packs_blocks_by_worker_then_table_and_unpacks_them_back(num_workers, widths):
    rng = np.random.default_rng(10 + num_workers)
    dims, most = ROW_WIDTHS[widths]
    counts, rows, positions = _row_case(rng, num_workers, dims, most)
    message, splits, local = ops().sok_ev_pack_row_message(rows, counts, [])
    np.testing.assert_array_equal(message.numpy(), _pack_reference(counts, rows))
    np.testing.assert_array_equal(splits.numpy(), (counts * np.array(dims)[:, None]).sum(axis=0))
    assert [tuple(x.shape) for x in local] == [(0, d) for d in dims]
    back = ops().sok_ev_unpack_row_message(message, counts, [], [], N=len(dims), dims=dims)
    for t in range(len(dims)):
        np.testing.assert_array_equal(back[t].numpy(), rows[t])
    # With positions: pack gathers rows[t][positions[t][i]], unpack scatters there.
    message = ops().sok_ev_pack_row_message(rows, counts, positions)[0]
    np.testing.assert_array_equal(message.numpy(), _pack_reference(counts, rows, positions))
    back = ops().sok_ev_unpack_row_message(message, counts, positions, [], N=len(dims), dims=dims)
    for t in range(len(dims)):
        np.testing.assert_array_equal(back[t].numpy(), rows[t])


def _unpack_rows(message, counts, positions, local, dims, local_worker):
    """UnpackRowMessage of N = len(dims) tables, with worker local_worker's
  block given beside the message as `local`."""
    return ops().sok_ev_unpack_row_message(message,
                                           counts,
                                           positions,
                                           local,
                                           N=len(dims),
                                           dims=dims,
                                           local_worker=local_worker)


@pytest.mark.parametrize("with_positions", [False, True], ids=["in_order", "positions"])
@pytest.mark.parametrize("widths", sorted(ROW_WIDTHS))
@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_the_local_workers_block_stays_out_of_the_message_and_comes_back_whole(
        num_workers, widths, with_positions):
    rng = np.random.default_rng(20 + num_workers)
    dims, most = ROW_WIDTHS[widths]
    counts, rows, positions = _row_case(rng, num_workers, dims, most)
    given = positions if with_positions else []
    for k in range(num_workers):
        message, splits, local = ops().sok_ev_pack_row_message(rows,
                                                               counts,
                                                               given,
                                                               local_worker=k,
                                                               Tmessage=tf.float32)
        np.testing.assert_array_equal(message.numpy(),
                                      _pack_reference(counts, rows, given or None, local_worker=k))
        want_splits = (counts * np.array(dims)[:, None]).sum(axis=0)
        want_splits[k] = 0
        np.testing.assert_array_equal(splits.numpy(), want_splits)
        for t, table in enumerate(rows):
            np.testing.assert_array_equal(local[t].numpy(),
                                          table[_block(counts, t, k, given or None)])
        back = _unpack_rows(message, counts, given, local, dims, k)
        for t in range(len(dims)):
            np.testing.assert_array_equal(back[t].numpy(), rows[t])


@pytest.mark.parametrize("message_dtype", [tf.uint16, tf.float16], ids=["bfloat16", "float16"])
def test_compressed_messages_keep_the_local_rows_exact(message_dtype):
    rng = np.random.default_rng(5)
    dims = [3, 4]
    counts = np.array([[4, 5], [2, 3]], np.int64)
    rows = [rng.standard_normal((int(c.sum()), d)).astype(np.float32) for c, d in zip(counts, dims)]
    positions = [rng.permutation(len(r)).astype(np.int64) for r in rows]
    message, _, local = ops().sok_ev_pack_row_message(rows,
                                                      counts,
                                                      positions,
                                                      Tmessage=message_dtype,
                                                      local_worker=1)
    assert message.shape == [int(counts[:, 0] @ np.array(dims))]
    back = _unpack_rows(message, counts, positions, local, dims, 1)
    for t in range(2):
        mine = _block(counts, t, 1, positions)
        np.testing.assert_array_equal(back[t].numpy()[mine], rows[t][mine])
        # The other block was rounded to 16 bits on the way.
        theirs = _block(counts, t, 0, positions)
        np.testing.assert_allclose(back[t].numpy()[theirs], rows[t][theirs], rtol=2.0**-8)


def _unpack_reference(counts, message, dims, positions):
    """Table t's rows from every worker's block, scattered by positions."""
    rows = [np.zeros([int(counts[t].sum()), d], np.float32) for t, d in enumerate(dims)]
    at = 0
    for w in range(counts.shape[1]):
        for t, d in enumerate(dims):
            first = int(counts[t, :w].sum())
            block = message[at:at + counts[t, w] * d].reshape(-1, d)
            rows[t][positions[t][first:first + counts[t, w]]] = block
            at += counts[t, w] * d
    return rows


def test_pack_and_unpack_gradients_are_each_other():
    rng = np.random.default_rng(7)
    dims = [2, 4, 3]
    counts, rows, positions = _row_case(rng, 3, dims)
    variables = [tf.Variable(r) for r in rows]
    upstream = rng.standard_normal(int(sum(r.size for r in rows))).astype(np.float32)
    with tf.GradientTape() as tape:
        message = ops().sok_ev_pack_row_message(variables, counts, positions)[0]
        loss = tf.reduce_sum(message * upstream)
    for grad, want in zip(tape.gradient(loss, variables),
                          _unpack_reference(counts, upstream, dims, positions)):
        np.testing.assert_array_equal(tf.convert_to_tensor(grad).numpy(), want)

    message = tf.Variable(_pack_reference(counts, rows, positions))
    upstream_rows = [rng.standard_normal(r.shape).astype(np.float32) for r in rows]
    with tf.GradientTape() as tape:
        back = ops().sok_ev_unpack_row_message(message,
                                               counts,
                                               positions, [],
                                               N=len(dims),
                                               dims=dims)
        loss = tf.add_n([tf.reduce_sum(b * u) for b, u in zip(back, upstream_rows)])
    np.testing.assert_array_equal(
        tape.gradient(loss, message).numpy(), _pack_reference(counts, upstream_rows, positions))


def test_with_a_local_worker_the_gradients_of_pack_and_unpack_are_still_each_other():
    rng = np.random.default_rng(8)
    dims = [2, 4, 3]
    counts, rows, positions = _row_case(rng, 3, dims)
    k = 1
    variables = [tf.Variable(r) for r in rows]
    upstream_rows = [rng.standard_normal(r.shape).astype(np.float32) for r in rows]
    # back[t][positions[t][i]] = rows[t][i], whichever block row i is in: the
    # message carries the other workers' part of the gradient, local the rest.
    with tf.GradientTape() as tape:
        message, _, local = ops().sok_ev_pack_row_message(variables, counts, [], local_worker=k)
        back = _unpack_rows(message, counts, positions, local, dims, k)
        loss = tf.add_n([tf.reduce_sum(b * u) for b, u in zip(back, upstream_rows)])
    for t, grad in enumerate(tape.gradient(loss, variables)):
        np.testing.assert_array_equal(
            tf.convert_to_tensor(grad).numpy(), upstream_rows[t][positions[t]])


def _combine_case(rng, num_workers, dims):
    """A requester's side of a row exchange: its unique keys' rows (in unique
  order), where each arrived (positions), and a batch over them, per table
  (ragged samples, empty ones, repeated keys, weights)."""
    counts, rows, positions = _row_case(rng, num_workers, dims)
    batches = []
    for table in rows:
        sizes = rng.integers(0, 4, size=int(rng.integers(1, 8)))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        nnz = int(offsets[-1]) if len(table) else 0
        offsets = np.minimum(offsets, nnz)
        index = rng.integers(0, max(len(table), 1), size=nnz).astype(np.int64)
        weights = rng.uniform(0.5, 2.0, size=nnz).astype(np.float32)
        batches.append((index, offsets, weights))
    return counts, rows, positions, batches


def _combine_reference(rows, index, offsets, weights, combiner):
    """tf.nn.embedding_lookup_sparse's combination, in float64: `[batch, dim]`."""
    out = np.zeros((len(offsets) - 1, rows.shape[1]))
    for b in range(len(offsets) - 1):
        entries = range(offsets[b], offsets[b + 1])
        if not entries:
            continue
        out[b] = sum(weights[j] * rows[index[j]].astype(np.float64) for j in entries)
        w = weights[offsets[b]:offsets[b + 1]].astype(np.float64)
        out[b] /= {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
    return out


def _segments_and_order(batches, positions):
    """Each table's entries grouped by key, as UniqueKeys groups them: the
  key boundaries (segments) and the entries in key order (a stable sort)."""
    segments = [
        np.concatenate([[0], np.cumsum(np.bincount(i, minlength=len(p)))]).astype(np.int64)
        for (i, _, _), p in zip(batches, positions)
    ]
    order = [np.argsort(i, kind="stable").astype(np.int64) for i, _, _ in batches]
    return segments, order


def _combine_row_message(message, counts, positions, local, batches, dims, combiners, local_worker):
    # Each key's entries, as UniqueKeys segments them (the backward reads
    # them; order may be empty on the CPU).
    segments, _ = _segments_and_order(batches, positions)
    return ops().sok_ev_combine_row_message(message,
                                            counts,
                                            positions,
                                            local, [tf.constant(i) for i, _, _ in batches],
                                            [tf.zeros([0], tf.int64)] * len(dims),
                                            [tf.constant(x) for x in segments],
                                            [tf.constant(o) for _, o, _ in batches],
                                            [tf.constant(w) for _, _, w in batches],
                                            dims=dims,
                                            combiners=combiners,
                                            weighted=[True] * len(dims),
                                            local_worker=local_worker)


# More tables than one GPU launch of the backward's sums carries (32,
# cc/segment_sum_gpu.cu), rows with and without 16-byte alignment mixed in
# each launch.
MANY_TABLES = [3, 4, 8, 128, 5, 1, 16] * 5 + [4, 3]


# dims 3 and 5 leave the rows of the tables after them off 16-byte
# boundaries in the message (the GPU then reads them a float at a time).
# "many": more tables of one kernel variant than one GPU launch of the
# combine carries (50, cc/table_launch_gpu.h).
@pytest.mark.parametrize("dims", [[4, 128, 8], [3, 128, 5, 8], [4, 3, 128, 8, 1] * 24],
                         ids=["aligned", "unaligned", "many"])
@pytest.mark.parametrize("num_workers, local_worker", [(1, 0), (2, 1), (3, -1), (3, 2)])
def test_combining_the_message_in_place_equals_combining_its_unpacked_rows(
        num_workers, local_worker, dims):
    rng = np.random.default_rng(40 + num_workers + local_worker)
    counts, rows, positions, batches = _combine_case(rng, num_workers, dims)
    combiners = [("sum", "mean", "sqrtn")[t % 3] for t in range(len(dims))]
    message, _, local = ops().sok_ev_pack_row_message(rows,
                                                      counts,
                                                      positions,
                                                      local_worker=local_worker)
    local = list(local) if local_worker >= 0 else []
    got = _combine_row_message(message, counts, positions, local, batches, dims, combiners,
                               local_worker)
    unpacked = _unpack_rows(message, counts, positions, local, dims, local_worker)
    # Every table in one CombineForward call, as the row exchange makes it.
    together = ops().sok_ev_combine_forward(unpacked, [tf.constant(i) for i, _, _ in batches],
                                            [tf.zeros([0], tf.int64)] * len(dims),
                                            [tf.zeros([0], tf.int64)] * len(dims),
                                            [tf.constant(o) for _, o, _ in batches],
                                            [tf.constant(w) for _, _, w in batches],
                                            combiners=combiners,
                                            weighted=[True] * len(dims))
    for t, (index, offsets, weights) in enumerate(batches):
        np.testing.assert_allclose(got[t].numpy(),
                                   _combine_reference(rows[t], index, offsets, weights,
                                                      combiners[t]),
                                   rtol=1e-5,
                                   atol=1e-6,
                                   err_msg=f"table {t}")
        # The same bits as the two ops it replaces.
        want = ops().sok_ev_combine_forward([unpacked[t]], [tf.constant(index)],
                                            [tf.zeros([0], tf.int64)], [tf.zeros([0], tf.int64)],
                                            [tf.constant(offsets)], [tf.constant(weights)],
                                            combiners=[combiners[t]],
                                            weighted=[True])[0]
        np.testing.assert_array_equal(got[t].numpy(), want.numpy(), err_msg=f"table {t}")
        np.testing.assert_array_equal(together[t].numpy(), want.numpy(), err_msg=f"table {t}")


def test_the_gradient_of_combining_the_message_is_each_keys_gradient_packed_as_the_message():
    rng = np.random.default_rng(44)
    dims, local_worker = [3, 8], 1
    counts, rows, positions, batches = _combine_case(rng, 2, dims)
    combiners = ["sum", "mean"]
    message, _, local = ops().sok_ev_pack_row_message(rows,
                                                      counts,
                                                      positions,
                                                      local_worker=local_worker)
    message, local = tf.Variable(message), [tf.Variable(x) for x in local]
    upstream = [
        rng.standard_normal((len(o) - 1, d)).astype(np.float32)
        for (_, o, _), d in zip(batches, dims)
    ]
    with tf.GradientTape() as tape:
        out = _combine_row_message(message, counts, positions, local, batches, dims, combiners,
                                   local_worker)
        loss = tf.add_n([tf.reduce_sum(o * u) for o, u in zip(out, upstream)])
    grad_message, *grad_local = tape.gradient(loss, [message] + local)
    # Each unique key's gradient: its entries' upstream rows, scaled as the
    # combiner scaled them.
    grad_unique = []
    for (index, offsets, weights), up, table, combiner in zip(batches, upstream, rows, combiners):
        grad = np.zeros(table.shape)
        for b in range(len(offsets) - 1):
            w = weights[offsets[b]:offsets[b + 1]].astype(np.float64)
            scale = 1.0 if combiner == "sum" else w.sum()
            for j in range(offsets[b], offsets[b + 1]):
                grad[index[j]] += weights[j] * up[b] / scale
        grad_unique.append(grad.astype(np.float32))
    np.testing.assert_allclose(tf.convert_to_tensor(grad_message).numpy(),
                               _pack_reference(counts, grad_unique, positions, local_worker),
                               rtol=1e-5,
                               atol=1e-6)
    for t, grad in enumerate(grad_local):
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   grad_unique[t][_block(counts, t, local_worker, positions)],
                                   rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("order_given", [True, False], ids=["order", "no_order"])
@pytest.mark.parametrize("dims", [[4, 128, 8], [3, 128, 5, 8], MANY_TABLES],
                         ids=["aligned", "unaligned", "many"])
@pytest.mark.parametrize("num_workers, local_worker", [(1, 0), (2, 1), (3, -1), (3, 2)])
def test_the_message_gradient_written_in_place_equals_combine_backward_then_pack(
        num_workers, local_worker, dims, order_given):
    rng = np.random.default_rng(60 + num_workers + local_worker)
    counts, rows, positions, batches = _combine_case(rng, num_workers, dims)
    combiners = [("sum", "mean", "sqrtn")[t % 3] for t in range(len(dims))]
    segments, order = _segments_and_order(batches, positions)
    if not order_given:  # UniqueKeys ran on the CPU
        order = [np.zeros([0], np.int64)] * len(dims)
    upstream = [
        rng.standard_normal((len(o) - 1, d)).astype(np.float32)
        for (_, o, _), d in zip(batches, dims)
    ]
    pieces = [[tf.constant(i) for i, _, _ in batches], [tf.constant(x) for x in order],
              [tf.constant(x) for x in segments], [tf.constant(o) for _, o, _ in batches],
              [tf.constant(w) for _, _, w in batches]]
    attrs = dict(combiners=combiners, weighted=[True] * len(dims))
    grad_message, grad_local = ops().sok_ev_combine_row_message_grad(upstream,
                                                                     counts,
                                                                     positions,
                                                                     *pieces,
                                                                     dims=dims,
                                                                     local_worker=local_worker,
                                                                     **attrs)
    # The two ops it replaces, each table's sums computed alone: grouping
    # the tables changes no bit.
    grad_unique = [
        ops().sok_ev_combine_backward([upstream[t]],
                                      *[[piece[t]] for piece in pieces],
                                      combiners=[combiners[t]],
                                      weighted=[True])[0] for t in range(len(dims))
    ]
    want_message, _, want_local = ops().sok_ev_pack_row_message(grad_unique,
                                                                counts,
                                                                positions,
                                                                local_worker=local_worker)
    np.testing.assert_array_equal(grad_message.numpy(), want_message.numpy())
    for t, grad in enumerate(grad_local):
        np.testing.assert_array_equal(grad.numpy(), want_local[t].numpy(), err_msg=f"table {t}")
    # And NumPy's: each key's entries' upstream rows, scaled as combined.
    reference = []
    for (index, offsets, weights), up, table, combiner in zip(batches, upstream, rows, combiners):
        grad = np.zeros(table.shape)
        for b in range(len(offsets) - 1):
            w = weights[offsets[b]:offsets[b + 1]].astype(np.float64)
            scale = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
            for j in range(offsets[b], offsets[b + 1]):
                grad[index[j]] += weights[j] * up[b] / scale
        reference.append(grad)
    np.testing.assert_allclose(grad_message.numpy(),
                               _pack_reference(counts, reference, positions, local_worker),
                               rtol=1e-5,
                               atol=1e-6)


def test_a_message_gradient_of_the_wrong_shape_fails_naming_it():
    counts, positions = tf.constant([[1, 2]], tf.int64), [tf.constant([2, 0, 1], tf.int64)]
    pieces = [[tf.constant([0, 1, 2, 2], tf.int64)], [tf.zeros([0], tf.int64)],
              [tf.constant([0, 1, 2, 4], tf.int64)], [tf.constant([0, 2, 4], tf.int64)],
              [tf.zeros([0])]]

    def grad(upstream, segments=pieces[2], local_worker=1):
        return ops().sok_ev_combine_row_message_grad(upstream,
                                                     counts,
                                                     positions,
                                                     pieces[0],
                                                     pieces[1],
                                                     segments,
                                                     *pieces[3:],
                                                     dims=[4],
                                                     combiners=["sum"],
                                                     weighted=[False],
                                                     local_worker=local_worker)

    message, local = grad([tf.ones([2, 4])])
    assert message.shape == [4] and local[0].shape == [2, 4]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"grads\[0\] must be \[2, 4\] \(row_offsets\[0\] samples of "
                       r"dims\[0\]\), got shape \[3,4\]"):
        grad([tf.ones([3, 4])])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 0: 3 segments for 3 unique keys"):
        grad([tf.ones([2, 4])], segments=[tf.constant([0, 2, 4], tf.int64)])
    message, local = grad([tf.ones([2, 4])], local_worker=-1)
    assert message.shape == [12] and local[0].shape == [0, 4]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"local_worker must be -1 or in"):
        grad([tf.ones([2, 4])], local_worker=5)


@pytest.mark.parametrize("counts, rows, error", [
    ([[1, -1]], [np.zeros([0, 2])], r"counts\[0, 1\] is negative: -1"),
    ([[1, 1]], [np.zeros([3, 2])], r"rows\[0\] has 3 rows, but counts sum to 2"),
    ([1, 1], [np.zeros([2, 2])], r"counts must be \[1, num_workers\], got shape \[2\]"),
])
def test_a_row_message_with_bad_counts_or_rows_fails_naming_them(counts, rows, error):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=error):
        ops().sok_ev_pack_row_message([tf.constant(r, tf.float32) for r in rows],
                                      tf.constant(counts, tf.int64), [])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        ops().sok_ev_unpack_row_message(tf.zeros([5]),
                                        tf.constant(counts, tf.int64), [], [],
                                        N=1,
                                        dims=[2])


def test_a_local_worker_outside_the_workers_or_local_rows_of_the_wrong_shape_fail_naming_them():
    counts = tf.constant([[1, 2]], tf.int64)
    rows = [tf.zeros([3, 2])]
    with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"local_worker must be -1 or in \[0, 2\) for counts of 2 workers, got 2"):
        ops().sok_ev_pack_row_message(rows, counts, [], local_worker=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"got -2"):
        ops().sok_ev_unpack_row_message(tf.zeros([6]),
                                        counts, [], [],
                                        N=1,
                                        dims=[2],
                                        local_worker=-2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"local must have 1 tensors for local_worker 1, got 0"):
        ops().sok_ev_unpack_row_message(tf.zeros([2]),
                                        counts, [], [],
                                        N=1,
                                        dims=[2],
                                        local_worker=1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"local\[0\] must be \[2, 2\] \(counts\[0, 1\] rows of dims\[0\]\), "
                       r"got shape \[1,2\]"):
        ops().sok_ev_unpack_row_message(tf.zeros([2]),
                                        counts, [], [tf.zeros([1, 2])],
                                        N=1,
                                        dims=[2],
                                        local_worker=1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"the message has shape \[6\], but counts and dims make 2 elements"):
        ops().sok_ev_unpack_row_message(tf.zeros([6]),
                                        counts, [], [tf.zeros([2, 2])],
                                        N=1,
                                        dims=[2],
                                        local_worker=1)


# The owner's end: its lookup of the keys it received, written into the rows
# message back (FindOrInsertRowMessage), and the gradient message read in
# place (FindOrInsertRowMessageGrad).

OWNER_ROWS = 50  # keys are in [0, OWNER_ROWS): key k starts at matrix[k]


def _received_keys(rng, counts, key_dtypes):
    """Per table: what an owner received (each worker's block of distinct
  keys, worker 0's first, as UnpackKeyMessage gives them) and each key's
  occurrences in its sender's batch."""
    keys, occurrences = [], []
    for table_counts, dtype in zip(counts, key_dtypes):
        # Sorted, as a GPU worker's UniqueKeys leaves them.
        blocks = [np.sort(rng.choice(OWNER_ROWS, size=int(c), replace=False)) for c in table_counts]
        keys.append(np.concatenate([np.zeros([0], np.int64)] + blocks).astype(dtype))
        occurrences.append(rng.integers(1, 5, size=len(keys[-1])).astype(np.int64))
    return keys, occurrences


def _owner_case(sok, rng, unique_name, num_workers, dims):
    """Tables (int64 and int32 keys alternating, rows from NumPy matrices),
  what the owner received, and UniqueOwnedKeys of it."""
    counts = rng.integers(0, 6, size=(len(dims), num_workers)).astype(np.int64)
    counts[0, :] = 0  # a table nobody asked anything of
    key_dtypes = [(np.int64, np.int32)[t % 2] for t in range(len(dims))]
    matrices = [ref.random_matrix(rng, OWNER_ROWS, d) for d in dims]
    tables = [
        ref.matrix_ev(sok, unique_name(), m, key_dtype=k) for m, k in zip(matrices, key_dtypes)
    ]
    keys, occurrences = _received_keys(rng, counts, key_dtypes)
    owned = ops().sok_ev_unique_owned_keys([tf.constant(k) for k in keys],
                                           [tf.constant(c) for c in occurrences], counts)
    return counts, tables, matrices, keys, occurrences, owned


def _owner_row_message(tables, owned, counts, local_worker):
    for table in tables:  # what lookup_sparse does: a tape then watches them
        table._record_access()  # pylint: disable=protected-access
    return ops().sok_ev_find_or_insert_row_message([t.handle for t in tables],
                                                   *owned,
                                                   counts,
                                                   embedding_dims=[t.embedding_dim for t in tables],
                                                   local_worker=local_worker)


@pytest.mark.parametrize("dims", [[4, 128, 8], [3, 128, 5, 8]], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("num_workers, local_worker", [(1, 0), (2, 1), (3, -1), (3, 2)])
def test_the_owners_rows_written_into_the_message_equal_find_or_insert_combine_then_pack(
        sok, rng, unique_name, num_workers, local_worker, dims):
    counts, tables, matrices, keys, occurrences, owned = _owner_case(sok, rng, unique_name,
                                                                     num_workers, dims)
    message, splits, local = _owner_row_message(tables, owned, counts, local_worker)
    # NumPy's: each received key's row, packed as PackRowMessage packs.
    rows = [m[k.astype(np.int64)] for m, k in zip(matrices, keys)]
    np.testing.assert_array_equal(message.numpy(), _pack_reference(counts, rows, None,
                                                                   local_worker))
    want_splits = (counts * np.array(dims)[:, None]).sum(axis=0)
    if local_worker >= 0:
        want_splits[local_worker] = 0
    np.testing.assert_array_equal(splits.numpy(), want_splits)
    for t, table_rows in enumerate(rows):
        want = table_rows[_block(counts, t, local_worker)] if local_worker >= 0 else np.zeros(
            [0, dims[t]])
        np.testing.assert_array_equal(local[t].numpy(), want, err_msg=f"table {t}")
    # Each key found once, its occurrences from every worker added to its
    # frequency.
    for t, (table, table_keys, table_occurrences) in enumerate(zip(tables, keys, occurrences)):
        stored, _, frequencies = table.export_full()[:3]
        want = {}
        for key, n in zip(table_keys.tolist(), table_occurrences.tolist()):
            want[key] = want.get(key, 0) + n
        assert dict(zip(stored.numpy().tolist(), frequencies.numpy().tolist())) == want
    # The same bits as the two ops it replaces (the keys now stored).
    values = ops().sok_ev_find_or_insert_combine([t.handle for t in tables],
                                                 *owned, [tf.zeros([0])] * len(dims),
                                                 embedding_dims=dims,
                                                 combiners=["sum"] * len(dims),
                                                 weighted=[False] * len(dims))
    want_message, want_splits, want_local = ops().sok_ev_pack_row_message(values,
                                                                          counts, [],
                                                                          local_worker=local_worker)
    np.testing.assert_array_equal(message.numpy(), want_message.numpy())
    np.testing.assert_array_equal(splits.numpy(), want_splits.numpy())
    for t in range(len(dims)):
        np.testing.assert_array_equal(local[t].numpy(), want_local[t].numpy())


def test_an_owner_reads_a_filtered_tables_rows_into_the_message_as_admission_decides(
        sok, unique_name):
    # DeepRec's admission: a key seen fewer than filter_freq times before this
    # lookup reads default_value_no_permission.
    option = sok.EmbeddingVariableOption(
        filter_option=sok.CounterFilter(filter_freq=3),
        init_option=sok.InitializerOption(default_value_no_permission=0.5))
    table = sok.get_embedding_variable(unique_name(),
                                       embedding_dim=4,
                                       initializer=tf.compat.v1.ones_initializer(),
                                       ev_option=option)
    counts = np.array([[2, 1]], np.int64)
    owned = ops().sok_ev_unique_owned_keys([tf.constant([7, 9, 7], tf.int64)],
                                           [tf.constant([2, 1, 2], tf.int64)], counts)
    message, _, local = _owner_row_message([table], owned, counts, local_worker=1)
    np.testing.assert_array_equal(message.numpy(), np.full([8], 0.5, np.float32))
    np.testing.assert_array_equal(local[0].numpy(), np.full([1, 4], 0.5, np.float32))
    # Key 7 has now been seen 4 times: admitted, it reads its initial row.
    message, _, local = _owner_row_message([table], owned, counts, local_worker=1)
    np.testing.assert_array_equal(message.numpy(), [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5])
    np.testing.assert_array_equal(local[0].numpy(), np.ones([1, 4], np.float32))


def _owner_gradient_case(rng, num_workers, dims, local_worker):
    """The owner's side of the gradients' exchange: which unique key each
  received row is (random keys, repeated across workers), the keys' segments
  and order, and the gradient message and local rows that arrive."""
    counts = rng.integers(0, 6, size=(len(dims), num_workers)).astype(np.int64)
    counts[0, :] = 0
    index = [rng.integers(0, max(int(c.sum()) // 2, 1), size=int(c.sum())) for c in counts]
    index = [np.unique(i, return_inverse=True)[1].astype(np.int64) for i in index]
    batches = [(i, np.arange(len(i) + 1, dtype=np.int64), None) for i in index]
    positions = [np.zeros(int(i.max()) + 1 if len(i) else 0) for i in index]
    segments, order = _segments_and_order(batches, positions)
    grad_rows = [rng.standard_normal((len(i), d)).astype(np.float32) for i, d in zip(index, dims)]
    message, _, local = ops().sok_ev_pack_row_message(grad_rows,
                                                      counts, [],
                                                      local_worker=local_worker)
    local = list(local) if local_worker >= 0 else []
    return counts, index, segments, order, grad_rows, message, local


@pytest.mark.parametrize("order_given", [True, False], ids=["order", "no_order"])
@pytest.mark.parametrize("dims", [[4, 128, 8], [3, 128, 5, 8], MANY_TABLES],
                         ids=["aligned", "unaligned", "many"])
@pytest.mark.parametrize("num_workers, local_worker", [(1, 0), (2, 1), (3, -1), (3, 2)])
def test_the_owners_gradient_read_in_place_equals_unpack_then_combine_backward(
        rng, num_workers, local_worker, dims, order_given):
    (counts, index, segments, order, grad_rows, message,
     local) = _owner_gradient_case(rng, num_workers, dims, local_worker)
    if not order_given:  # UniqueOwnedKeys ran on the CPU
        order = [np.zeros([0], np.int64)] * len(dims)
    pieces = [[tf.constant(i) for i in index], [tf.constant(o) for o in order],
              [tf.constant(s) for s in segments],
              [tf.range(len(i) + 1, dtype=tf.int64) for i in index]]
    got = ops().sok_ev_find_or_insert_row_message_grad(message,
                                                       counts,
                                                       local,
                                                       *pieces,
                                                       dims=dims,
                                                       local_worker=local_worker)
    # NumPy's: each unique key sums the gradient rows of its received keys.
    for t, (table_index, rows) in enumerate(zip(index, grad_rows)):
        want = np.zeros((len(segments[t]) - 1, dims[t]))
        np.add.at(want, table_index, rows.astype(np.float64))
        np.testing.assert_allclose(got[t].numpy(), want, rtol=1e-5, atol=1e-6, err_msg=f"table {t}")
    # The same bits as the two ops it replaces, each table's sums computed
    # alone: grouping the tables changes no bit.
    unpacked = _unpack_rows(message, counts, [], local, dims, local_worker)
    for t in range(len(dims)):
        want = ops().sok_ev_combine_backward([unpacked[t]],
                                             *[[piece[t]] for piece in pieces], [tf.zeros([0])],
                                             combiners=["sum"],
                                             weighted=[False])[0]
        np.testing.assert_array_equal(got[t].numpy(), want.numpy(), err_msg=f"table {t}")


def test_training_through_the_owners_message_sums_each_keys_gradients_from_every_worker(
        sok, rng, unique_name):
    dims, local_worker = [4, 8, 3], 0
    counts, tables, matrices, keys, _, owned = _owner_case(sok, rng, unique_name, 3, dims)
    upstream_message = rng.standard_normal(int((counts[:, 1:] * np.array(dims)[:, None]).sum()))
    upstream_local = [rng.standard_normal((int(c[0]), d)) for c, d in zip(counts, dims)]
    with tf.GradientTape() as tape:
        message, _, local = _owner_row_message(tables, owned, counts, local_worker)
        loss = tf.reduce_sum(message * upstream_message.astype(np.float32)) + tf.add_n(
            [tf.reduce_sum(x * u.astype(np.float32)) for x, u in zip(local, upstream_local)])
    grads = tape.gradient(loss, tables)
    # Received row j of table t gets upstream row j (message or local);
    # each key's gradient sums its rows'.
    upstream_rows = _unpack_rows(tf.constant(upstream_message, tf.float32), counts, [],
                                 [tf.constant(u, tf.float32) for u in upstream_local], dims,
                                 local_worker)
    for t, (grad, table_keys) in enumerate(zip(grads, keys)):
        want = {}
        for key, row in zip(table_keys.tolist(), upstream_rows[t].numpy().astype(np.float64)):
            want[key] = want.get(key, 0.0) + row
        got = ref.indexed_slices_to_dict(grad.indices.numpy(), grad.values.numpy())
        assert sorted(got) == sorted(want), f"table {t}"
        ref.assert_rows_close(got, want, 1e-5, 1e-6, f"table {t}")


def test_an_owners_lookup_that_does_not_fit_its_counts_fails_before_any_table_changes(
        sok, unique_name):
    table = sok.get_embedding_variable(unique_name(), embedding_dim=4)
    owned = ops().sok_ev_unique_owned_keys([tf.constant([7, 9, 7], tf.int64)],
                                           [tf.constant([1, 1, 1], tf.int64)], [[2, 1]])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 0: counts give 4 received keys, but 3 entries and 3 samples"):
        _owner_row_message([table], owned, np.array([[2, 2]], np.int64), local_worker=1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"local_worker must be -1 or in \[0, 2\) for counts of 2 workers, "
                       r"got 2"):
        _owner_row_message([table], owned, np.array([[2, 1]], np.int64), local_worker=2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"counts must be \[1, num_workers\], got shape \[2\]"):
        _owner_row_message([table], owned, np.array([2, 1], np.int64), local_worker=1)
    assert int(table.total_count()) == 0


def test_an_owners_gradient_message_that_does_not_fit_its_keys_fails_naming_them():
    counts = tf.constant([[1, 2]], tf.int64)

    def grad(message, local, row_offsets=(0, 1, 2, 3)):
        return ops().sok_ev_find_or_insert_row_message_grad(message,
                                                            counts,
                                                            local,
                                                            [tf.constant([0, 1, 0], tf.int64)],
                                                            [tf.zeros([0], tf.int64)],
                                                            [tf.constant([0, 2, 3], tf.int64)],
                                                            [tf.constant(row_offsets, tf.int64)],
                                                            dims=[4],
                                                            local_worker=1)

    got = grad(tf.ones([4]), [tf.ones([2, 4])])[0]
    np.testing.assert_array_equal(got.numpy(), [[2] * 4, [1] * 4])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"the message has shape \[8\], but counts and dims make 4 elements"):
        grad(tf.ones([8]), [tf.ones([2, 4])])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"local\[0\] must be \[2, 4\]"):
        grad(tf.ones([4]), [tf.ones([3, 4])])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 0: counts give 3 received rows, but 3 row offsets"):
        grad(tf.ones([4]), [tf.ones([2, 4])], row_offsets=(0, 1, 3))
