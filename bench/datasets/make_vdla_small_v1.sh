#!/bin/sh
# The accelerator's second training set: small convolutions (planes of 2 to
# 14, 16 to 128 channels) on the first set's eight configs, with the same two held out
# (the same --platforms, --held-out-platforms and --seed draw the same configs). Small
# layers are where a schedule's fixed costs weigh most and the timing model is least
# right; the first set has none. Then 8 more a workload that the pretrained model of
# the first set and this set's random schedules picks (--picked): where it is wrong at
# the top of its ranking. Resumable, as make_vdla_v1.sh.
set -e
cd "$(dirname "$0")/../.."
db=bench/datasets/vdla_small_v1.db
[ -f $db ] || [ ! -f $db.xz ] || xz -dk $db.xz
vdla dataset --small-shapes 48 --shapes 0 \
    --platforms 8 --held-out-platforms 2 \
    --per-task 24 --picked 8 --seed 0 --jobs 2 \
    --records $db "$@"
xz -9 -kf -T2 $db
