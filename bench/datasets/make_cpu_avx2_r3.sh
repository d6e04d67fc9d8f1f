#!/bin/sh
# avx2 alone, every schedule measured in three rounds (the adaptation figure of bench/tuner_transfer.py): the
# workloads of make_cpu_v2.sh (int8 and float32, same seeds and counts), on one
# platform, the avx2 code, one thread, one job; each row takes the median of its three
# runs, and the rounds show how far two measurements of one schedule agree. About 35
# minutes on the 2-core host; run it on a quiet machine. Extra arguments go to both runs.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_avx2_r3.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset resnet18 mobilenet_v1 --target cpu --threads 1 --isa avx2 \
    --platforms 1 --held-out-models resnet50 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 --rounds 3 \
    --records $db --manifest bench/datasets/cpu_avx2_r3.db.manifest.json "$@"
vdla dataset resnet18 --target cpu --threads 1 --precision float32 --isa avx2 \
    --platforms 1 --held-out-models resnet50 mobilenet_v1 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 --rounds 3 \
    --records $db --manifest bench/datasets/cpu_f32_avx2_r3.db.manifest.json "$@"
xz -9 -kf -T2 $db
