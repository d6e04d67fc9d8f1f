#!/bin/sh
# The accelerator's third training set: transformer workloads. The linear layers over
# a sequence's tokens (random dense layers of 16 to 256 rows, --token-shapes), the
# batched products of two activations of attention's scores and values
# (--matmul-t-shapes: a @ b^T, as the accelerator runs them), and gpt_mini's own, on the first set's eight configs with the same
# two held out (the same --platforms, --held-out-platforms and --seed draw the same
# configs). bert_tiny, bert_base and vit_tiny are held out: the tuner meets them only
# as a user would. Then 4 more a workload that the pretrained model and this set's
# random schedules pick (--picked). Resumable, as make_vdla_v1.sh. On an Intel Xeon
# with AMX and 2 cores (2 workers) it measured 2,112 schedules in 1,555 s; the 516 of
# the transformer products and identity products were measured again (201 s, the
# manifest's `seconds`) after a fix to how a product's task fed its (1, S, D) inputs.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/vdla_seq_v1.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset gpt_mini --token-shapes 8 --matmul-t-shapes 10 --shapes 0 \
    --platforms 8 --held-out-platforms 2 \
    --held-out-models bert_tiny bert_base vit_tiny \
    --per-task 8 --picked 4 --seed 0 --jobs 2 \
    --records $db "$@"
xz -9 -kf -T2 $db
