#!/bin/sh
# The CPU target's held-out set: ResNet-50's int8 layers on the widest
# instruction set this machine runs, 12 schedules each, one thread, one job, for
# bench/tuner_transfer.py's held-out ranking. Each schedule is measured three times, in
# three passes over the set (--rounds 3): the rows take the median, and the rounds show
# how far two wall-time measurements of one schedule agree, the ceiling of any model's
# ranking. make_cpu_v2.sh's set never measured ResNet-50. Resumable; the records are
# kept xz-compressed.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_test_v2.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset resnet50 --target cpu --threads 1 --platforms 1 --shapes 0 \
    --per-task 12 --rounds 3 --seed 0 --jobs 1 --records $db "$@"
xz -9 -kf -T2 $db
