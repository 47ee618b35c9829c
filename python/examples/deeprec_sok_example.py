"""DeepRec Embedding Variable + SOK lookup on stock TensorFlow, with sok_ev.

One worker:    python python/examples/deeprec_sok_example.py
Two workers:   horovodrun -np 2 -H localhost:2 --gloo \
                   python python/examples/deeprec_sok_example.py [--target_gpu K]
Expected: the loss starts at 30 (ones rows; sample 0 = key 1 twice, sample 1
= keys 3, 4, 5, so sum(2 * emb) = 2 * 3 * (2 + 3)) and falls as Adagrad(0.1)
trains the four keys.
With Horovod, every worker feeds this batch, the table is sharded over the
workers (or kept whole on worker K with --target_gpu K), each key's gradient
is summed over the workers by its owner, and every rank prints the same
emb and the workers' mean loss.
"""
import argparse
import os

import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()
import sok_ev as sok

try:  # Multi-worker runs (horovodrun) average the loss; one worker needs no Horovod.
    import horovod.tensorflow as hvd
except Exception:  # not installed (or built against another TF): one worker
    hvd = None

parser = argparse.ArgumentParser()
parser.add_argument("--target_gpu",
                    type=int,
                    default=-1,
                    help="-1 shards the table over the workers; K keeps it on worker K")
args = parser.parse_args()
multi_worker = hvd is not None and int(os.environ.get("HOROVOD_SIZE", "1")) > 1
if multi_worker:
    hvd.init()
sok.init()
var = sok.get_embedding_variable("var_0",
                                 embedding_dim=3,
                                 initializer=tf.ones_initializer(tf.float32))
var.target_gpu = args.target_gpu
indices = tf.SparseTensor(indices=tf.convert_to_tensor([[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                                                       dtype=tf.int64),
                          values=tf.convert_to_tensor([1, 1, 3, 4, 5], dtype=tf.int64),
                          dense_shape=[2, 3])
emb = sok.lookup_sparse([var], [indices], combiners=['sum'])
fun = tf.multiply(emb, 2.0, name='multiply')
loss = tf.reduce_sum(fun, name='reduce_sum')
opt = tf.train.AdagradOptimizer(0.1)
g_v = opt.compute_gradients(loss)
if multi_worker:
    # Data parallelism for dense variables only: Embedding Variable gradients
    # already hold every worker's part for the keys this worker owns, and
    # sok_ev refuses to allreduce them (hvd.DistributedOptimizer included).
    g_v = [(g if isinstance(v, sok.EmbeddingVariable) else hvd.allreduce(g), v) for g, v in g_v]
    loss = hvd.allreduce(loss)  # the workers' mean loss, printed on every rank
train_op = opt.apply_gradients(g_v)
init = tf.global_variables_initializer()
with tf.Session() as sess:
    sess.run([init])
    print(sess.run([emb, train_op, loss]))
    print(sess.run([emb, train_op, loss]))
    print(sess.run([emb, train_op, loss]))
