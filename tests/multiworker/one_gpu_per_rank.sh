#!/bin/sh
# Runs one Horovod rank with only its own GPU visible (the GPU mode of
# harness.py): NCCL refuses two ranks on one GPU (ncclCommInitRank: invalid
# usage). Usage, under horovodrun: one_gpu_per_rank.sh COMMAND [ARGS...]
export CUDA_VISIBLE_DEVICES="${HOROVOD_LOCAL_RANK:?one_gpu_per_rank.sh runs under horovodrun}"
exec "$@"
