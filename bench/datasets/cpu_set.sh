#!/bin/sh
# One version of the CPU target's training set, two manifests over one records file:
# `cpu_set.sh VERSION [ARGS]` with VERSION v2 or v3 (make_cpu_v2.sh and make_cpu_v3.sh
# say what each holds); extra arguments go to both runs.
set -e
v=$1
shift
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_$v.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
isas=$(python3 -c "from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.isa import ISAS
print(sum(i.runs_on(machine_features()) for i in ISAS.values()))")
vdla dataset resnet18 mobilenet_v1 --target cpu --threads 1 \
    --platforms "$isas" --held-out-models resnet50 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 \
    --records $db --manifest bench/datasets/cpu_$v.db.manifest.json "$@"
vdla dataset resnet18 --target cpu --threads 1 --precision float32 \
    --platforms "$isas" --held-out-models resnet50 mobilenet_v1 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 \
    --records $db --manifest bench/datasets/cpu_f32_$v.db.manifest.json "$@"
xz -9 -kf -T2 $db
