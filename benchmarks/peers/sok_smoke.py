#!/usr/bin/env python3
"""The smallest SOK 2.1.0 lookup and Adagrad step, one variable kind per
process, to tell whether SOK runs at all on this machine and to get a native
backtrace where it crashes (the benchmark's processes died of SIGFPE and
illegal memory accesses before their first step):

  python3 benchmarks/peers/sok_smoke.py KIND     KIND: static | hbm | hybrid
  cuda-gdb -batch -ex run -ex bt --args python3 benchmarks/peers/sok_smoke.py static

static is sok.Variable; hbm and hybrid are sok.DynamicVariable on SOK's two
hash tables (DET and HKV). Prints the lookup, then "step done".
"""
import sys

import tensorflow as tf


def main(kind):
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    import sparse_operation_kit as sok  # pylint: disable=import-outside-toplevel
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    hvd.init()
    sok.init(use_legacy_optimizer=False)  # Keras 3 has no .legacy optimizers
    opt = tf.compat.v1.train.AdagradOptimizer(0.1, 0.1)
    if kind == "static":
        table = sok.Variable(shape=[64, 4],
                             initializer=tf.random_uniform_initializer(-1, 1),
                             dtype=tf.float32)
    else:
        config = dict(init_capacity=1024, max_capacity=1024) if kind == "hybrid" else {}
        table = sok.DynamicVariable(dimension=4,
                                    var_type=kind,
                                    initializer="random",
                                    key_type=tf.int64,
                                    **config)
        opt = sok.OptimizerWrapper(opt)
    ids = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([1, 3, 5], tf.int64), [2, 2])
    print(f"[{kind}] lookup:", sok.lookup_sparse([table], [ids], combiners=["sum"]), flush=True)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
    grads = tape.gradient(loss, [table])
    print(f"[{kind}] gradient done", flush=True)  # which op a crash is in
    opt.apply_gradients(zip(grads, [table]))
    print(f"[{kind}] step done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
