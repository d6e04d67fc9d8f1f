#!/bin/sh
# The CPU target's first training set (issue 39): the int8 tunable ops of ResNet-18 and
# MobileNet-v1 and 8 random convolutions, on every instruction set this machine runs
# (each a platform: avx512vnni, avx2, portable), one thread, measured by wall time with
# one job (no other measurement shares the cores). ResNet-50 is held out; its layers
# are measured by make_cpu_test_v1.sh. Resumable; the records are kept xz-compressed.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_v1.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
isas=$(python3 -c "from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.isa import ISAS
print(sum(i.runs_on(machine_features()) for i in ISAS.values()))")
vdla dataset resnet18 mobilenet_v1 --target cpu --threads 1 \
    --platforms "$isas" --held-out-models resnet50 \
    --shapes 8 --per-task 6 --seed 0 --jobs 1 \
    --records $db "$@"
xz -9 -kf -T2 $db
