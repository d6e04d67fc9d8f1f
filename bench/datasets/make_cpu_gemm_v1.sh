#!/bin/sh
# The CPU target's training set for its GEMMs: the dense layers (`cpu.dense` version 2),
# a transformer's linear layers over its tokens among them, and the batched products of
# two activations (`cpu.matmul` version 1). Two manifests over one records file, on every
# instruction set this machine runs (each a platform), one thread, measured by wall time
# (the fastest of many runs) with one job:
#   cpu_gemm_v1      int8: the tunable ops of the zoo's bert_tiny, gpt_mini and vit_tiny
#                    (their dense layers; vit_tiny's patch embedding is no task), 16
#                    random dense layers of 16 to 256 rows (--token-shapes) and 14 random
#                    products (--matmul-shapes);
#   cpu_gemm_f32_v1  float32: the same models' and shapes' float layers.
# BERT-base is held out of both: cpu_gemm_test_v1 and cpu_gemm_f32_test_v1, its int8 and
# float32 layers on the widest instruction set, are what scripts/train_cost_model.py
# --test ranks the shipped models on; their schedules are measured again side by side in
# 15 rounds (--side-by-side), since its large layers read megabytes of weights, whose
# whole measurements on a shared machine differ by up to 2x between identical kernels.
# 8 schedules a workload (12 for the held-out sets), drawn at random. Measured on a
# shared 2-core machine (other benchmarks and tests ran beside it). Resumable; the
# records are kept xz-compressed. Extra arguments go to every run.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/cpu_gemm_v1.db
test=bench/datasets/cpu_gemm_test_v1.db
for f in $db $test; do [ -f $f ] || [ ! -f $f.xz ] || xz -dk $f.xz; done
isas=$(python3 -c "from vdla.compiler.targets.cpu.build import machine_features
from vdla.compiler.targets.cpu.isa import ISAS
print(sum(i.runs_on(machine_features()) for i in ISAS.values()))")
for precision in int8 float32; do
    name=cpu_gemm_v1
    [ $precision = int8 ] || name=cpu_gemm_f32_v1
    vdla dataset bert_tiny gpt_mini vit_tiny --target cpu --threads 1 \
        --precision $precision --platforms "$isas" --held-out-models bert_base \
        --shapes 0 --token-shapes 16 --matmul-shapes 14 --per-task 8 --seed 0 --jobs 1 \
        --records $db --manifest bench/datasets/$name.db.manifest.json "$@"
    vdla dataset bert_base --target cpu --threads 1 --precision $precision \
        --platforms 1 --shapes 0 --per-task 12 --side-by-side 15 --seed 0 --jobs 1 \
        --records $test --manifest bench/datasets/${name%_v1}_test_v1.db.manifest.json "$@"
done
xz -9 -kf -T2 $db
xz -9 -kf -T2 $test
