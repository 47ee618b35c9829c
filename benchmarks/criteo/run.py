"""The Criteo benchmark: a CTR model trained with sok-ev and with stock TensorFlow, in one run.

Both implementations train the same model (DLRM or DCNv2, Adagrad) on the same
batches (in turn on the CPU; each alone on a GPU, the baseline on the first
--baseline-steps only) and are evaluated on the same held-out split:
  sok_ev    26 Embedding Variables in one sok_ev.lookup_sparse call, sharded
            over the workers; only dense gradients are allreduced;
  baseline  26 hash-bucketed tf.Variables (2x the true cardinality),
            tf.nn.embedding_lookup_sparse, replicated (all gradients reduced).

Prints, for each implementation, eval AUC and logloss (sklearn), training
samples/s (global batch / step time), its end-to-end samples/s (input
included) and its time waiting for input, embedding memory; the input
pipeline's rate alone; and the targets of issues 10 and 53; writes curves.png,
throughput.png, run.json and results_line.md into --out-dir; appends one line
to benchmarks/RESULTS.md's Criteo history (and, for a run of the defaults on the
CPU or with --device gpu, rewrites its rows of the current table) and one record
to benchmarks/criteo/runs.jsonl.

Data: with --train-files/--eval-files, real Criteo files (Kaggle's train.txt
split in two, e.g. its first 39,291,958 lines, six of its seven days, and the
rest; or Terabyte day_N files, plain or .gz), or preprocessed ones, picked by
extension or --format (formats.py): NVTabular Parquet (*.parquet, needs
pyarrow), HugeCTR one-hot Raw (*.bin), TorchRec/MLPerf NumPy days
(day_N_{dense,sparse,labels}.npy, any of the three names a day); --max-*-lines
then count records. Otherwise a synthetic data set with a planted model
(benchmarks/criteo/synthetic.py), generated once into --data-dir; the planted
model's AUC on the eval split is printed with the rest; or (--source memory, the
GPU default) the same rows made as arrays in memory (in_memory.py).

  python benchmarks/criteo/run.py                       # CPU defaults, a few minutes on 2 cores
  python benchmarks/criteo/run.py --model dcnv2 --style session
  horovodrun --gloo -np 2 -H localhost:2 python benchmarks/criteo/run.py
  python benchmarks/criteo/run.py --device gpu          # GPU defaults (~2 min on one H200):
                                                        # batch 65536, dim 128, batches made
                                                        # in memory, sok-ev 2048 steps
  python benchmarks/criteo/run.py --train-files kaggle_days_1-6.txt --eval-files kaggle_day_7.txt
  python benchmarks/criteo/run.py --train-files train/*.parquet --eval-files valid/*.parquet
  python benchmarks/criteo/run.py --train-files train_data.bin --eval-files test_data.bin
  python benchmarks/criteo/run.py --train-files day_{0..22}_labels.npy --eval-files day_23_labels.npy
  # Terabyte: the baseline's tables at twice its cardinalities fit no machine; sok-ev alone:
  python benchmarks/criteo/run.py --impl sok_ev --train-files day_{0..22}.gz --eval-files day_23.gz
"""
import argparse
import fcntl
import json
import os
import resource
import shlex
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# benchmarks.criteo, and this checkout's sok_ev ahead of an installed one where
# request.sh built its op library into sok_ev/; without it (a copy of the tree
# on a GPU machine with the GPU wheel installed), the installed sok_ev.
if os.path.exists(os.path.join(REPO_ROOT, "sok_ev", "_sok_ev_ops.so")):
    sys.path.insert(0, REPO_ROOT)
else:
    sys.path.append(REPO_ROOT)

import tensorflow as tf  # noqa: E402

from benchmarks.criteo import embeddings as embeddings_lib  # noqa: E402
from benchmarks.criteo import formats  # noqa: E402
from benchmarks.criteo import in_memory  # noqa: E402
from benchmarks.criteo import metrics  # noqa: E402
from benchmarks.criteo import models  # noqa: E402
from benchmarks.criteo import reader  # noqa: E402
from benchmarks.criteo import report  # noqa: E402
from benchmarks.criteo import synthetic  # noqa: E402
from benchmarks.criteo import training  # noqa: E402
from benchmarks import results as results_md  # noqa: E402
# The first visible GPU's memory in bytes, or None (no GPU, no libcuda). Call
# it after the data's worker processes have forked: it initialises CUDA here.
from benchmarks.gpu_memory import total_bytes as gpu_memory_bytes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(REPO_ROOT, "benchmarks", "RESULTS.md")
RUNS = os.path.join(HERE, "runs.jsonl")
WARMUP_STEPS = 2  # per implementation, left out of samples/s (tracing, first inserts)
# How close to the planted model's AUC sok-ev must come: on the CPU, one pass
# over the default data; on a GPU, the ~2-minute default run.
AUC_MARGIN = {"cpu": 0.002, "gpu": 0.005}

# Defaults by device. GPU: DeepRec's SOK example's shape (global batch 65536,
# dim 128 for DLRM, 64 for DCNv2, MLP [1024, 512, 256, 1], Adagrad), trained
# long enough to learn in about two minutes on one H200: its 0.01 with
# TensorFlow's initial accumulator 0.1 learns nothing in 64 steps (AUC 0.533,
# loss above the constant predictor's): at batch 65536 a key's gradient is its
# few occurrences / 65536, ~1e-5, and sqrt(0.1) damps its step to ~3e-7.
# So the embeddings take Adagrad with a near-0 accumulator (steps of about the
# rate, whatever the gradient's scale) at 0.05, as on the CPU; the 1024-wide
# tower takes such sign-like steps badly (the loss jumps, even at 0.005) and
# keeps TensorFlow's 0.1, at 0.05 (on the CPU at this batch, 30 steps:
# 0.01 learns slowly, AUC 0.667; 0.1 faster, 0.732, with spikes after a
# 10-step warm-up, hence 20). sok-ev trains 2048 steps (~51 s at its 24.7 ms:
# at this batch a smaller model's gap to the planted AUC fell from 0.026 after
# 100 steps to 0.021 after 150, ~1/sqrt(steps)), the baseline its first 128
# (~23 s at 180 ms), both evaluated at step 128; the
# batches are made in memory (the text path cannot keep up), cardinalities
# at 0.1 x Kaggle's (3.4M keys). CPU: a model and data set for a few minutes
# on 2 cores. There Adagrad's initial accumulator is near PyTorch's 0: TensorFlow's
# 0.1 damps the first updates of every new key, and one pass over the default
# data then ends 0.015 below the planted AUC instead of 0.002 (RESULTS.md); a
# 50-step warm-up keeps the first steps' loss from spiking. Dim 32, not 16:
# Embedding Variables spend up to 46 B per key besides the row (key,
# frequency, version, index), which at dim 16 weighs a third of the row.
PRESETS = {
    "gpu":
        dict(batch=65536,
             learning_rate={
                 "dlrm": 0.05,
                 "dcnv2": 0.05
             },
             initial_accumulator=1e-6,
             dense_learning_rate=0.05,
             dense_initial_accumulator=0.1,
             dim={
                 "dlrm": 128,
                 "dcnv2": 64
             },
             bottom=[512, 256],
             top=[1024, 512, 256, 1],
             deep=[1024, 512, 256],
             cross_layers=3,
             cross_rank=512,
             warmup_steps=20,
             train_lines=2048 * 65536,
             eval_lines=262_144,
             cardinality_scale=0.1,
             baseline_steps=128,
             source="memory",
             schedule="sequential"),
    "cpu":
        dict(batch=1024,
             learning_rate={
                 "dlrm": 0.05,
                 "dcnv2": 0.01
             },
             initial_accumulator=1e-6,
             dim={
                 "dlrm": 32,
                 "dcnv2": 32
             },
             bottom=[64],
             top=[256, 128, 1],
             deep=[256, 128],
             cross_layers=3,
             cross_rank=64,
             warmup_steps=50,
             train_lines=2_000_000,
             eval_lines=100_000,
             source="text",
             schedule="interleaved"),
}

# --hotness mlperf: MLPerf DLRM-DCNv2's shape on a GPU (dim 128, bottom
# 512-256-128, 3 cross layers of rank 512, deep 1024-1024-512-256; MLPerf
# trains Adagrad too), over PRESETS. Its tables hold 40M rows at most each
# (187.8M in all, 96 GB of float32 rows before Adagrad's slots); the synthetic
# data's cardinalities at 0.1 x Kaggle's (3.4M keys, 3.5 GB with the slots)
# fit one GPU with the baseline's tables beside them. On the CPU: PRESETS'
# small model, with the bottom MLP.
MLPERF_PRESETS = {
    "gpu":
        dict(dim={
            "dlrm": 128,
            "dcnv2": 128
        },
             bottom=[512, 256],
             deep=[1024, 1024, 512, 256],
             cross_layers=3,
             cross_rank=512),
    "cpu": {},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    g = p.add_argument_group("run")
    g.add_argument("--model", choices=["dlrm", "dcnv2"], default="dlrm")
    g.add_argument("--style",
                   choices=["function", "session"],
                   default="function",
                   help="TF2 tf.function, or TF1 graph + tf.compat.v1.Session (DeepRec habit)")
    g.add_argument("--impl", choices=["both", "sok_ev", "baseline"], default="both")
    g.add_argument("--device",
                   choices=["auto", "cpu", "gpu"],
                   default="auto",
                   help="picks the defaults below (auto: gpu if TensorFlow sees one)")
    g.add_argument("--threads",
                   type=int,
                   default=None,
                   help="TensorFlow threads per worker (default: cores / local workers)")
    g.add_argument("--evals", type=int, default=4, help="evaluations, evenly spaced, last at end")
    g.add_argument("--schedule",
                   choices=training.SCHEDULES,
                   help="interleaved: both implementations on each batch in turn (CPU default); "
                   "sequential: each alone over its own pass of the input (GPU default), so "
                   "that its end-to-end rate is its own")
    g.add_argument("--baseline-steps",
                   type=int,
                   help="train the baseline on the first N batches only (evaluated then, "
                   "at equal steps with sok-ev's evaluation there)")
    g.add_argument("--exchange-dtype",
                   choices=["float32", "bfloat16", "float16"],
                   default="float32",
                   help="sok_ev: what rows and gradients cross the workers as (no effect on 1)")
    g.add_argument("--eval-batch",
                   type=int,
                   help="lines per evaluation step (default: the larger of --batch and 16384)")
    g.add_argument("--seed", type=int, default=0, help="initial weights")
    g.add_argument("--out-dir", default=os.path.join(HERE, "out"))
    g.add_argument("--no-append",
                   action="store_true",
                   help="write neither RESULTS.md nor runs.jsonl")
    g.add_argument("--no-progress", action="store_true")
    m = p.add_argument_group("model (defaults: see PRESETS in this file)")
    m.add_argument("--batch", type=int, help="global batch, split evenly over the workers")
    m.add_argument("--dim", type=int, help="embedding width")
    m.add_argument("--learning-rate", type=float)
    m.add_argument("--bottom", type=int, nargs="+", help="DLRM bottom MLP (dim is appended)")
    m.add_argument("--top", type=int, nargs="+", help="DLRM top MLP (ends at 1)")
    m.add_argument("--deep", type=int, nargs="+", help="DCNv2 deep MLP")
    m.add_argument("--cross-layers", type=int)
    m.add_argument("--cross-rank", type=int, help="DCNv2 low rank; 0 = full rank")
    m.add_argument("--initial-accumulator",
                   type=float,
                   help="Adagrad's initial accumulator (TensorFlow's default: 0.1)")
    m.add_argument("--dense-learning-rate",
                   type=float,
                   help="Adagrad's rate for the dense tower (default: --learning-rate)")
    m.add_argument("--dense-initial-accumulator",
                   type=float,
                   help="Adagrad's initial accumulator for the dense tower "
                   "(default: --initial-accumulator)")
    m.add_argument("--warmup-steps", type=int, help="linear learning-rate warm-up steps")
    m.add_argument("--hotness",
                   choices=["one", "mlperf"],
                   default="one",
                   help="keys per feature: one, or MLPerf DLRM-DCNv2's multi-hot (214 a line, "
                   "summed per feature; synthetic data gets companion keys, in_memory.py; files "
                   "must be --format raw_multihot or numpy_multihot); with --model dcnv2 the "
                   "tower gets MLPerf's bottom MLP (--bottom + dim) and, on a GPU, MLPerf's "
                   "shape (MLPERF_PRESETS)")
    m.add_argument("--compute-dtype",
                   choices=["float32", "bfloat16"],
                   default="float32",
                   help="DCNv2: the cross and deep layers' type (mixed precision: float32 "
                   "weights and logits)")
    m.add_argument("--xla-tower",
                   action="store_true",
                   help="compile the tower (forward and backward) with XLA inside the step; "
                   "sok-ev's ops stay outside it. --style function only (the DCNv2 bfloat16 "
                   "tower of MLPerf's shape: 17.7 against 34.8 ms a step on an H200, "
                   "benchmarks/gpu/criteo_step_split.py --mlperf)")
    m.add_argument("--embedding-stddev",
                   type=float,
                   default=0.05,
                   help="truncated-normal stddev of initial embedding rows")
    d = p.add_argument_group("data")
    d.add_argument("--train-files", nargs="+", help="real Criteo files to train on")
    d.add_argument("--eval-files", nargs="+", help="real Criteo files to evaluate on")
    d.add_argument("--format",
                   choices=("auto",) + formats.FORMATS + formats.MULTIHOT_FORMATS,
                   default="auto",
                   help="of --train-files/--eval-files (auto: by extension: .parquet NVTabular "
                   "Parquet, .bin/.raw HugeCTR one-hot Raw, .npy TorchRec NumPy days, else "
                   "Criteo text; the multi-hot ones go with --hotness mlperf; see "
                   "benchmarks/criteo/formats.py)")
    d.add_argument("--cardinalities",
                   default="kaggle",
                   help="real data: distinct values per feature for the baseline's buckets "
                   "(x2): 'kaggle', one number for all, or 26 comma-separated numbers")
    d.add_argument("--max-train-lines", type=int)
    d.add_argument("--max-eval-lines", type=int)
    d.add_argument("--on-malformed", choices=reader.ON_MALFORMED, default="skip")
    d.add_argument("--data-dir",
                   default=os.path.join(HERE, "data"),
                   help="where synthetic data sets are generated (one folder each)")
    d.add_argument("--train-lines", type=int, help="synthetic training lines")
    d.add_argument("--eval-lines", type=int, help="synthetic eval lines")
    d.add_argument("--cardinality-scale",
                   type=float,
                   help="synthetic: Kaggle's cardinalities times this "
                   "(default: Kaggle's keys per line)")
    d.add_argument("--zipf", type=float, default=1.1, help="synthetic: Zipf exponent")
    d.add_argument("--data-seed", type=int, default=0, help="synthetic: data set seed")
    d.add_argument("--source",
                   choices=["text", "memory"],
                   help="synthetic: files in Criteo's text format, parsed as real files are "
                   "(CPU default), or the same rows made as arrays in memory, no text "
                   "(GPU default; --style function)")
    d.add_argument("--batches-on-gpu",
                   action=argparse.BooleanOptionalAction,
                   default=None,
                   help="--source memory on a GPU, --style function: the arrays held in GPU "
                   "memory and each step building its own batch there, so that no batch crosses "
                   "from the host on the step's path (default: on where it applies and the "
                   "arrays take at most a quarter of the GPU's memory; --no-batches-on-gpu: "
                   "tf.data batches cut on the host)")
    args = p.parse_args(argv)
    if bool(args.train_files) != bool(args.eval_files):
        p.error("--train-files and --eval-files go together")
    if args.source == "memory" and args.style != "function":
        p.error("--source memory needs --style function (a TF1 graph would embed the arrays), "
                f"got --style {args.style}")
    if args.source == "memory" and args.train_files:
        p.error("--source memory is for synthetic data; --train-files are read as files")
    if args.baseline_steps is not None and args.baseline_steps < 1:
        p.error(f"--baseline-steps must be >= 1, got {args.baseline_steps}")
    return args


def apply_preset(args, device):
    preset = dict(PRESETS[device])
    if args.hotness == "mlperf":
        preset.update(MLPERF_PRESETS[device])
    for key in ("batch", "initial_accumulator", "warmup_steps", "bottom", "top", "deep",
                "cross_layers", "cross_rank", "train_lines", "eval_lines", "schedule",
                "baseline_steps", "cardinality_scale", "dense_learning_rate",
                "dense_initial_accumulator"):
        if getattr(args, key) is None:
            setattr(args, key, preset.get(key))
    if args.source is None:
        # Arrays in memory need the tf.function style (a graph would embed them);
        # multi-hot synthetic data exists only in memory.
        memory = args.style == "function" and (preset["source"] == "memory" or
                                               args.hotness == "mlperf")
        args.source = "memory" if memory else "text"
    for key in ("dim", "learning_rate"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key][args.model])


def check_hotness(args):
    """Exits naming the flags when --hotness and the data or model disagree."""
    if args.train_files:
        fmt = formats.format_of(args.train_files, args.format)
        if (args.hotness == "mlperf") != (fmt in formats.MULTIHOT_FORMATS):
            sys.exit(f"--hotness {args.hotness} does not match --format {fmt}: multi-hot files "
                     f"({', '.join(formats.MULTIHOT_FORMATS)}) go with --hotness mlperf, "
                     "one-hot ones with --hotness one")
    elif args.hotness == "mlperf" and args.source != "memory":
        sys.exit("--hotness mlperf on synthetic data needs --source memory and --style function "
                 f"(multi-hot lines are made in memory), got --source {args.source} "
                 f"--style {args.style}")
    if args.xla_tower and args.style != "function":
        sys.exit(f"--xla-tower needs --style function, got --style {args.style}")
    if args.compute_dtype != "float32" and args.model != "dcnv2":
        sys.exit(f"--compute-dtype {args.compute_dtype} is for --model dcnv2, got --model "
                 f"{args.model}")


def hotness_of(args):
    """Keys per feature for the embeddings (None: one)."""
    return formats.MLPERF_HOTNESS if args.hotness == "mlperf" else None


def horovod_or_none():
    """horovod.tensorflow, initialised, when launched by horovodrun; else None."""
    if "HOROVOD_RANK" not in os.environ:
        return None
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    hvd.init()
    return hvd


def configure_devices(args, hvd):
    """Threads, and one GPU per worker (HOROVOD_LOCAL_RANK) with memory growth.
  Returns the tf.compat.v1.ConfigProto the Session style uses."""
    local_size = hvd.local_size() if hvd else 1
    local_rank = hvd.local_rank() if hvd else 0
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // local_size)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.threads,
                                      inter_op_parallelism_threads=args.threads,
                                      allow_soft_placement=True)
    gpus = tf.config.list_physical_devices("GPU")
    if args.device == "cpu":
        tf.config.set_visible_devices([], "GPU")
        config.device_count["GPU"] = 0
    elif gpus:
        gpu = gpus[local_rank % len(gpus)]
        if args.style == "function":
            tf.config.set_visible_devices(gpu, "GPU")
            tf.config.experimental.set_memory_growth(gpu, True)
        config.gpu_options.visible_device_list = str(local_rank % len(gpus))
        config.gpu_options.allow_growth = True
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.config.set_soft_device_placement(True)
    return config


def prepare_data(args, rank):
    """(train files, eval files, true cardinalities, metadata or None, description);
  with --source memory, (in_memory.InMemoryData, None, ...) instead of the files."""
    if args.train_files:
        if args.cardinalities == "kaggle":
            cardinalities = list(synthetic.KAGGLE_CARDINALITIES)
        else:
            values = [int(v) for v in args.cardinalities.split(",")]
            cardinalities = values * reader.NUM_CATEGORICAL if len(values) == 1 else values
        if len(cardinalities) != reader.NUM_CATEGORICAL:
            sys.exit(f"--cardinalities needs 1 or {reader.NUM_CATEGORICAL} numbers, got "
                     f"{len(cardinalities)}")
        return (args.train_files, args.eval_files, cardinalities, None,
                f"files {' '.join(args.train_files)} / {' '.join(args.eval_files)}")
    scale = args.cardinality_scale
    if scale is None:
        scale = synthetic.default_cardinality_scale(args.train_lines + args.eval_lines)
    description = (f"synthetic seed {args.data_seed}: {args.train_lines:,} train + "
                   f"{args.eval_lines:,} eval lines, cardinality scale {scale:.4g}, "
                   f"Zipf {args.zipf:g}")
    bar = training.progress_bar(total=args.train_lines + args.eval_lines,
                                unit="line",
                                disable=rank != 0 or args.no_progress,
                                unit_scale=True,
                                desc="generating")
    if args.source == "memory":
        data = in_memory.InMemoryData(args.train_lines,
                                      args.eval_lines,
                                      seed=args.data_seed,
                                      cardinality_scale=scale,
                                      zipf=args.zipf,
                                      processes=os.cpu_count() or 1,
                                      progress=bar.update,
                                      hotness=hotness_of(args))
        bar.close()
        meta = dict(vocabulary=data.vocabulary, planted=data.planted, train_lines=args.train_lines)
        if args.hotness == "mlperf":
            description += f", MLPerf hotness ({formats.MULTIHOT_KEYS} keys a line)"
        return data, None, data.vocabulary, meta, description + ", made in memory"
    name = (f"synthetic_s{args.data_seed}_{args.train_lines}_{args.eval_lines}_"
            f"c{scale:.6g}_z{args.zipf:g}")
    directory = os.path.join(args.data_dir, name)
    os.makedirs(directory, exist_ok=True)
    # Every worker calls generate under one lock: the first writes, the rest reuse.
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta = synthetic.generate(directory,
                                  args.train_lines,
                                  args.eval_lines,
                                  seed=args.data_seed,
                                  cardinality_scale=scale,
                                  zipf=args.zipf,
                                  processes=min(8,
                                                os.cpu_count() or 1),
                                  progress=bar.update)
        bar.close()
    return ([meta["files"]["train"]], [meta["files"]["eval"]], meta["vocabulary"], meta,
            description)


def build_implementations(args, cardinalities, hvd):
    """The implementations asked for, in the current graph / eagerly."""
    import sok_ev as sok  # pylint: disable=import-outside-toplevel
    sok.init()
    if not hvd or hvd.rank() == 0:
        print(f"sok_ev from {os.path.dirname(sok.__file__)}", flush=True)

    def tower():
        if args.model == "dlrm":
            return models.DLRM(args.dim, args.bottom + [args.dim], args.top, seed=2 * args.seed)
        # MLPerf's DLRM-DCNv2 puts a bottom MLP (ending at dim) on the integers.
        return models.DCNv2(args.dim,
                            args.cross_layers,
                            args.cross_rank,
                            args.deep,
                            seed=2 * args.seed,
                            bottom=args.bottom + [args.dim] if args.hotness == "mlperf" else None,
                            compute_dtype=args.compute_dtype)

    emb_seed = 1000 * (2 * args.seed + 1)
    out = []
    if args.impl in ("both", "sok_ev"):
        out.append(
            training.Implementation(
                embeddings_lib.SokEvEmbeddings(sok,
                                               args.dim,
                                               args.embedding_stddev,
                                               emb_seed,
                                               exchange_dtype=args.exchange_dtype,
                                               hotness=hotness_of(args),
                                               batch_on_gpu=args.batches_on_gpu), tower(),
                args.learning_rate, args.batch, hvd, args.initial_accumulator, args.warmup_steps,
                args.dense_learning_rate, args.dense_initial_accumulator, args.xla_tower))
    if args.impl in ("both", "baseline"):
        out.append(
            training.Implementation(
                embeddings_lib.HashBucketEmbeddings(args.dim, [2 * c for c in cardinalities],
                                                    args.embedding_stddev,
                                                    emb_seed,
                                                    hotness=hotness_of(args),
                                                    batch_on_gpu=args.batches_on_gpu), tower(),
                args.learning_rate, args.batch, hvd, args.initial_accumulator, args.warmup_steps,
                args.dense_learning_rate, args.dense_initial_accumulator, args.xla_tower))
    return out


def datasets(args, train_files, eval_files, hvd):
    workers, rank = (hvd.size(), hvd.rank()) if hvd else (1, 0)
    options = tf.data.Options()
    options.threading.private_threadpool_size = args.threads
    if args.source == "memory":
        data = train_files
        train = data.dataset("train",
                             args.batch,
                             num_workers=workers,
                             worker_index=rank,
                             drop_remainder=True,
                             max_lines=args.max_train_lines).with_options(options)
        evaluation = data.dataset("eval",
                                  args.eval_batch or max(args.batch, 16384),
                                  max_lines=args.max_eval_lines).with_options(options)
        return train, evaluation
    fmt = args.format if args.train_files else "text"  # synthetic data is text
    train = formats.criteo_dataset(train_files,
                                   args.batch,
                                   fmt,
                                   num_workers=workers,
                                   worker_index=rank,
                                   on_malformed=args.on_malformed,
                                   drop_remainder=True,
                                   max_lines=args.max_train_lines).with_options(options)
    # Every worker evaluates every eval line (sok-ev lookups are collective).
    evaluation = formats.criteo_dataset(eval_files,
                                        args.eval_batch or max(args.batch, 16384),
                                        fmt,
                                        on_malformed=args.on_malformed,
                                        max_lines=args.max_eval_lines).cache().with_options(options)
    return train, evaluation


def command_line(argv, workers):
    cmd = "python " + " ".join([os.path.relpath(os.path.abspath(sys.argv[0]), REPO_ROOT)] +
                               [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)])
    return cmd if workers == 1 else f"horovodrun -np {workers} {cmd}"


def end_to_end(result, batch):
    """Samples/s of the whole loop (every implementation, input, staging), the
  warm-up steps and the evaluations left out."""
    ends = result["step_end_seconds"]
    if len(ends) <= WARMUP_STEPS:
        return len(ends) * batch / ends[-1]
    return (len(ends) - WARMUP_STEPS) * batch / (ends[-1] - ends[WARMUP_STEPS - 1])


def batches_on_gpu_apply(args, device) -> bool:
    """Whether --batches-on-gpu can apply: a GPU, --source memory and --style
  function."""
    return device == "gpu" and args.source == "memory" and args.style == "function"


def check_batches_on_gpu(args, device):
    """Exits naming the flags when --batches-on-gpu is asked for where it
  cannot apply (batches_on_gpu_apply)."""
    if args.batches_on_gpu is True and not batches_on_gpu_apply(args, device):
        sys.exit("--batches-on-gpu needs a GPU, --source memory and --style function, got "
                 f"device {device}, --source {args.source}, --style {args.style}")


def resolve_batches_on_gpu(args, device, data_bytes, gpu_memory):
    """Sets --batches-on-gpu's default when it was not given: on where it
  applies (batches_on_gpu_apply) and the data's arrays (data_bytes) take at
  most a quarter of the GPU's memory (gpu_memory bytes; None: not known, so
  off), leaving the rest to the tables and the model. It measured 1.22x the
  host-cut batches' samples/s on one H200 (benchmarks/RESULTS.md, criteo)."""
    if args.batches_on_gpu is not None:
        return
    args.batches_on_gpu = bool(
        batches_on_gpu_apply(args, device) and gpu_memory is not None and
        data_bytes <= gpu_memory // 4)


def device_batches(args, data, hvd):
    """--batches-on-gpu: {'train': (rows, build), 'eval': (rows, build)} of
  `data` (in_memory.InMemoryData) on GPU:0, as `datasets` cuts them."""
    workers, rank = (hvd.size(), hvd.rank()) if hvd else (1, 0)
    return {
        "train":
            data.batches("train",
                         args.batch,
                         num_workers=workers,
                         worker_index=rank,
                         drop_remainder=True,
                         max_lines=args.max_train_lines,
                         device="/GPU:0"),
        "eval":
            data.batches("eval",
                         args.eval_batch or max(args.batch, 16384),
                         max_lines=args.max_eval_lines,
                         device="/GPU:0"),
    }


def device_batch_rate(rows, build, batch, batches=32):
    """Global-batch samples/s of building batches alone (--batches-on-gpu):
  `batches` builds of a tf.function, each waited for (the first, which
  traces it, left out)."""
    built = tf.function(lambda row_range: tf.reduce_sum(build(row_range)["keys"][:1]),
                        input_signature=[training.ROW_RANGE])
    ranges = [tf.constant(r, tf.int32) for r in rows[:batches + 1]]
    if not ranges:
        return None
    built(ranges[0]).numpy()
    start = time.perf_counter()
    for row_range in ranges[1:]:
        built(row_range).numpy()
    return (len(ranges) - 1) * batch / max(time.perf_counter() - start, 1e-9)


def input_rate(dataset, batch, batches=32):
    """Global-batch samples/s of the input pipeline alone: `batches` batches
  read with nothing else running (the first, which starts it, left out)."""
    iterator = iter(dataset)
    next(iterator)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        try:
            next(iterator)
        except StopIteration:
            break
        n += 1
    return n * batch / max(time.perf_counter() - start, 1e-9)


def thin(values, points=200):
    """At most `points` values: means of consecutive groups (curves in runs.jsonl)."""
    groups = np.array_split(np.asarray(values, np.float64), min(points, len(values)))
    return [float(g.mean()) for g in groups]


def summarize(args, result, style, hvd):
    """{name: numbers} of each implementation."""
    workers = hvd.size() if hvd else 1
    out = {}
    for impl in style.implementations:
        c = result["curves"][impl.name]
        timed = c.seconds[WARMUP_STEPS:] or c.seconds
        loop = c.loop_seconds[WARMUP_STEPS:] or c.loop_seconds
        x = dict(auc=c.eval_auc[-1],
                 logloss=c.eval_logloss[-1],
                 steps=len(c.seconds),
                 samples_per_second=len(timed) * args.batch / sum(timed),
                 end_to_end_samples_per_second=len(loop) * args.batch / sum(loop),
                 input_seconds=c.input_seconds,
                 step_ms_median=1e3 * float(np.median(timed)),
                 final_train_loss=float(np.mean(c.loss[-max(1,
                                                            len(c.loss) // 10):])),
                 first_step_seconds=c.seconds[0],
                 curve=dict(samples=thin(c.samples),
                            loss=thin(c.loss),
                            eval_samples=c.eval_samples,
                            eval_auc=c.eval_auc))
        if impl.name == "sok_ev":
            keys = style.keys_stored(impl)
            x.update(keys_stored=keys,
                     bytes_per_key=embeddings_lib.sok_ev_bytes_per_key(
                         args.dim, training.ADAGRAD_SLOTS),
                     embedding_bytes=impl.embeddings.memory_bytes(keys, training.ADAGRAD_SLOTS))
        else:
            x.update(rows_allocated=sum(impl.embeddings.buckets) * workers,
                     embedding_bytes=impl.embeddings.memory_bytes(training.ADAGRAD_SLOTS) * workers)
        out[impl.name] = x
    return out


def print_summary(record, meta, previous_runs):
    r = record["results"]
    planted = record.get("planted_auc")
    print(
        f"\nCriteo {report.model_name(record)}, {record['style']}, {record['workers']} worker(s), "
        f"global batch {record['global_batch']}, dim {record['dim']}, {record['steps']} steps; "
        f"{record['data']}")
    if record["malformed"]:
        print(f"malformed lines skipped: {record['malformed']}")
    # samples/s: the step alone (global batch / step time); end to end: the
    # loop's time that is the implementation's own, waits for input included.
    print(f"{'':10} {'AUC':>8} {'logloss':>8} {'steps':>6} {'samples/s':>11} {'step ms':>8} "
          f"{'end to end':>11} {'input wait':>10}  {'embedding memory'}")
    if planted is not None:
        print(f"{'planted':10} {planted:8.4f} {meta['planted']['eval']['logloss']:8.4f}")
    for name, x in r.items():
        memory = f"{x['embedding_bytes'] / 2**20:,.1f} MB"
        if name == "sok_ev":
            memory += f" ({x['keys_stored']:,} keys x {x['bytes_per_key']} B)"
        else:
            memory += f" ({x['rows_allocated']:,} rows)"
        print(f"{name:10} {x['auc']:8.4f} {x['logloss']:8.4f} {x['steps']:6} "
              f"{x['samples_per_second']:11,.0f} {x['step_ms_median']:8.1f} "
              f"{x['end_to_end_samples_per_second']:11,.0f} {x['input_seconds']:9.1f}s  {memory}")
    checks = []
    if "sok_ev" in r:
        s = r["sok_ev"]
        if planted is not None:
            gap = s["auc"] - planted
            margin = AUC_MARGIN[record["device"]]
            checks.append((f"AUC within {margin} of the planted model", abs(gap)
                           <= margin, f"{gap:+.4f}"))
        if "baseline" in r:
            b = r["baseline"]
            at = b["steps"]
            if at < s["steps"]:
                # The baseline stopped early: sok-ev's AUC after as many steps.
                curve = s["curve"]
                sok_auc = curve["eval_auc"][curve["eval_samples"].index(at *
                                                                        record["global_batch"])]
                print(f"sok_ev after the baseline's {at} steps: AUC {sok_auc:.4f}")
                what = f"AUC >= the baseline's at its {at} steps"
            else:
                sok_auc, what = s["auc"], "AUC >= the baseline's"
            checks.append((what, sok_auc >= b["auc"], f"{sok_auc - b['auc']:+.4f}"))
            speed = s["samples_per_second"] / b["samples_per_second"]
            checks.append(("samples/s >= the baseline's", speed >= 1.0, f"{speed:.2f}x"))
            memory = s["embedding_bytes"] / b["embedding_bytes"]
            checks.append(("embedding memory <= 1/3 of the baseline's", memory
                           <= 1 / 3, f"{memory:.3f}x"))
        single = [
            p for p in previous_runs if p["workers"] == 1 and p["workers"] != record["workers"]
        ]
        if single:
            gap = s["auc"] - single[-1]["results"]["sok_ev"]["auc"]
            checks.append(
                (f"AUC equals the 1-worker run's ({single[-1]['date']}) to 0.002", abs(gap)
                 <= 0.002, f"{gap:+.4f}"))
    for what, met, value in checks:
        print(f"  target: {what}: {value} -> {'met' if met else 'MISSED'}")
    record["targets"] = [dict(target=w, met=bool(m), value=v) for w, m, v in checks]


def append_record(record, runs=RUNS, results=RESULTS):
    """Appends the run to runs.jsonl and its line to RESULTS.md's Criteo
  history; a run of a current-table row's configuration rewrites that row too."""
    report.append_run(runs, record)
    results_md.append(report.results_line(record) + "\n", "criteo", results)
    for row, cells in report.current_rows(record, results_md.commit()).items():
        results_md.update_row(row, results, **cells)
    print(f"appended to {os.path.relpath(runs)}")


def main(argv=None):
    args = parse_args(argv)
    hvd = horovod_or_none()
    rank, workers = (hvd.rank(), hvd.size()) if hvd else (0, 1)
    device = args.device
    if device == "auto":
        device = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    apply_preset(args, device)
    check_hotness(args)
    check_batches_on_gpu(args, device)
    if args.batch % workers:
        sys.exit(f"--batch {args.batch} must split evenly over {workers} workers")
    # Before TensorFlow's runtime starts: the generator forks worker processes.
    train_files, eval_files, cardinalities, meta, description = prepare_data(args, rank)
    if args.batches_on_gpu is None:
        data_bytes = train_files.nbytes if args.source == "memory" else 0
        resolve_batches_on_gpu(args, device, data_bytes,
                               gpu_memory_bytes() if device == "gpu" else None)
    if args.batches_on_gpu:
        description += ", batches built on the GPU"
    config = configure_devices(args, hvd)
    files = {"train": train_files, "eval": eval_files}
    lines = args.max_train_lines or (None if meta is None else meta["train_lines"])
    total_steps = None if lines is None else lines // args.batch
    eval_at = ([] if total_steps is None else
               [round(total_steps * k / args.evals) for k in range(1, args.evals)])
    if args.baseline_steps:
        eval_at.append(args.baseline_steps)  # both evaluated at equal steps

    if args.style == "session":
        tf.compat.v1.disable_v2_behavior()
        train_data, eval_data = datasets(args, train_files, eval_files, hvd)
        style = training.SessionStyle(lambda: build_implementations(args, cardinalities, hvd),
                                      train_data, eval_data, files, config)
    elif args.batches_on_gpu:
        batches = device_batches(args, train_files, hvd)
        style = training.FunctionStyle(build_implementations(args, cardinalities, hvd),
                                       None,
                                       None,
                                       files,
                                       device_batches=batches)
    else:
        train_data, eval_data = datasets(args, train_files, eval_files, hvd)
        style = training.FunctionStyle(build_implementations(args, cardinalities, hvd), train_data,
                                       eval_data, files)
    # The pipeline's own rate, before training competes with it (Session
    # style: not measured, its dataset lives in the graph).
    pipeline_rate = None
    if args.batches_on_gpu:
        pipeline_rate = device_batch_rate(*batches["train"], args.batch)
    elif args.style != "session":
        try:
            pipeline_rate = input_rate(train_data, args.batch)
        except tf.errors.InvalidArgumentError as error:  # a malformed record, named
            training.malformed_or_raise(error, files["train"])
    result = training.train_and_evaluate(style,
                                         args.batch,
                                         eval_at,
                                         metrics.auc_and_logloss,
                                         total_steps=total_steps,
                                         progress=rank == 0 and not args.no_progress,
                                         max_steps={"baseline": args.baseline_steps},
                                         schedule=args.schedule)
    results = summarize(args, result, style, hvd)
    if rank != 0:
        return
    record = dict(date=report.now(),
                  machine=report.machine(),
                  load_average=os.getloadavg()[0],
                  command=command_line(argv, workers),
                  model=args.model,
                  style=args.style,
                  device=device,
                  workers=workers,
                  exchange_dtype=args.exchange_dtype,
                  threads=args.threads,
                  global_batch=args.batch,
                  dim=args.dim,
                  hotness=args.hotness,
                  compute_dtype=args.compute_dtype,
                  learning_rate=args.learning_rate,
                  steps=result["steps"],
                  malformed=result["malformed"],
                  data=description,
                  planted_auc=None if meta is None else meta["planted"]["eval"]["auc"],
                  train_seconds=result["step_end_seconds"][-1],
                  eval_seconds=result["eval_seconds"],
                  input_seconds=result["input_seconds"],
                  end_to_end_samples_per_second=end_to_end(result, args.batch),
                  input_samples_per_second=pipeline_rate,
                  schedule=args.schedule,
                  source=args.source if meta is not None else args.format,
                  peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  results=results)
    # Records from before --hotness and --compute-dtype ran one-hot in float32.
    same = lambda r: all(  # noqa: E731
        r.get(k, report.RECORD_DEFAULTS.get(k)) == record[k] for k in
        ("model", "style", "device", "global_batch", "dim", "data", "hotness", "compute_dtype"))
    previous = [r for r in report.read_runs(RUNS) if same(r)]
    print_summary(record, meta, previous)
    if pipeline_rate is not None:
        print(f"input pipeline alone ({record['source']}): {pipeline_rate:,.0f} samples/s")
    loop = ("every implementation and the input" if args.schedule == "interleaved" else
            "the first implementation's pass, input included")
    print(f"whole loop ({loop}; no warm-up, no eval): "
          f"{record['end_to_end_samples_per_second']:,.0f} samples/s (waiting for input "
          f"{record['input_seconds']:.1f} s in all); eval "
          f"{record['eval_seconds']:.1f} s; peak RSS {record['peak_rss_bytes'] / 2**20:,.0f} MB; "
          f"load average {record['load_average']:.1f}")
    os.makedirs(args.out_dir, exist_ok=True)
    title = report.title(record)
    curves_png = os.path.join(args.out_dir, "curves.png")
    curves = {name: x["curve"] for name, x in results.items()}
    throughput_png = os.path.join(args.out_dir, "throughput.png")
    if (report.plot_curves(curves_png, curves, record["planted_auc"], title) and
            report.plot_throughput(throughput_png, previous + [record],
                                   report.title(record, workers=False))):
        print(f"plots: {os.path.relpath(curves_png)}, {os.path.relpath(throughput_png)}")
    else:
        print("no plots: matplotlib is not installed (bash request.sh installs it)")
    with open(os.path.join(args.out_dir, "run.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(args.out_dir, "results_line.md"), "w") as f:
        f.write(report.results_line(record) + "\n")  # for runs whose tree is thrown away
    if not args.no_append:
        append_record(record)


if __name__ == "__main__":
    main()
