#!/bin/sh
# The CPU target's held-out model for `cpu.conv2d` version 3: ResNet-50's
# int8 and float32 layers on the widest instruction set this machine runs, 12 schedules
# each drawn as make_cpu_v3.sh draws them (plain, blocked and Winograd in turn), one
# thread, one job. make_cpu_v3.sh's set never measured ResNet-50, so
# scripts/train_cost_model.py --test ranks the shipped model on layers it never saw,
# blocked and Winograd schedules among them. Resumable; the records are kept
# xz-compressed.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_test_v3.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset resnet50 --target cpu --threads 1 --platforms 1 --shapes 0 \
    --per-task 12 --seed 0 --jobs 1 --records $db \
    --manifest bench/datasets/cpu_test_v3.db.manifest.json "$@"
vdla dataset resnet50 --target cpu --threads 1 --platforms 1 --shapes 0 \
    --precision float32 --per-task 12 --seed 0 --jobs 1 --records $db \
    --manifest bench/datasets/cpu_f32_test_v3.db.manifest.json "$@"
xz -9 -kf -T2 $db
