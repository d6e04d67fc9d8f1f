#!/bin/sh
# The held-out model of the CPU target's training set (make_cpu_v1.sh): ResNet-50's int8
# tunable ops on the widest instruction set this machine runs, one thread, 8 schedules
# a layer, by wall time. For testing only: bench/tuner_transfer.py's CPU part ranks
# them with a model trained on cpu_v1.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_test_v1.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset resnet50 --target cpu --threads 1 --platforms 1 --shapes 0 \
    --per-task 8 --seed 0 --jobs 1 --records $db "$@"
xz -9 -kf -T2 $db
