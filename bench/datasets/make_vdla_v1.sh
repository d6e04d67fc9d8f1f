#!/bin/sh
# The accelerator's first training set: what the learned cost model is
# trained on. Resumable: run again to measure only what is missing (the records and the
# manifest are written next to this script; the repository keeps the records
# xz-compressed, which a resume unpacks first). On an AMD EPYC with 2 cores (2 workers)
# it measured 4,992 schedules in 3,223 s (with 8 Verilator builds); the manifest's own
# `seconds` is its last run's (a resume that measured nothing).
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/vdla_v1.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset resnet18 mobilenet_v1 \
    --platforms 8 --held-out-platforms 2 --held-out-models resnet50 \
    --shapes 16 --per-task 12 --seed 0 --jobs 2 \
    --records $db "$@"
xz -9 -kf -T2 $db
