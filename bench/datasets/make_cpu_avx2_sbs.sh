#!/bin/sh
# avx2 alone, every workload's schedules measured side by side (the adaptation figure of
# bench/tuner_transfer.py, against labels two halves of whose rounds order 0.99 of pairs alike): the
# workloads and schedules of make_cpu_v2.sh (int8 and float32, same seeds and counts) on
# the avx2 code, one thread, one job; after each schedule's own measurement, every
# workload's 12 schedules in turn, 21 rounds of slots of a few milliseconds
# (`vdla dataset --side-by-side`); each row takes the median of its 22 figures. About
# 12 minutes on the 2-core host. Extra arguments go to both runs.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_avx2_sbs.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset resnet18 mobilenet_v1 --target cpu --threads 1 --isa avx2 \
    --platforms 1 --held-out-models resnet50 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 --side-by-side 21 \
    --records $db --manifest bench/datasets/cpu_avx2_sbs.db.manifest.json "$@"
vdla dataset resnet18 --target cpu --threads 1 --precision float32 --isa avx2 \
    --platforms 1 --held-out-models resnet50 mobilenet_v1 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 --side-by-side 21 \
    --records $db --manifest bench/datasets/cpu_f32_avx2_sbs.db.manifest.json "$@"
xz -9 -kf -T2 $db
