#!/bin/sh
# The CPU target's training set (issue 39), two manifests over one records file, on
# every instruction set this machine runs (each a platform: avx512vnni, avx2, portable),
# one thread, measured by wall time (the fastest of many runs) with one job, so that no
# other measurement shares the cores:
#   cpu_v2      int8: the tunable ops of ResNet-18 and MobileNet-v1, 16 random
#               convolutions and 8 random grouped ones (half depthwise);
#   cpu_f32_v2  float32: ResNet-18's, and the same random convolutions and grouped ones
#               as float layers. MobileNet-v1 float32 is held out: bench/tuner_model.py
#               tunes it as a model the set never measured at that precision.
# ResNet-50 is held out of both; make_cpu_test_v2.sh measures its layers. Resumable; the
# records are kept xz-compressed. Extra arguments go to both runs.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_v2.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
isas=$(python3 -c "from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.isa import ISAS
print(sum(i.runs_on(machine_features()) for i in ISAS.values()))")
vdla dataset resnet18 mobilenet_v1 --target cpu --threads 1 \
    --platforms "$isas" --held-out-models resnet50 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 \
    --records $db --manifest bench/datasets/cpu_v2.db.manifest.json "$@"
vdla dataset resnet18 --target cpu --threads 1 --precision float32 \
    --platforms "$isas" --held-out-models resnet50 mobilenet_v1 \
    --shapes 16 --grouped-shapes 8 --per-task 12 --seed 0 --jobs 1 \
    --records $db --manifest bench/datasets/cpu_f32_v2.db.manifest.json "$@"
xz -9 -kf -T2 $db
