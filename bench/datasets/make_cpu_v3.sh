#!/bin/sh
# The CPU target's training set for `cpu.conv2d` version 3 (the blocked layout
# and Winograd are knobs), two manifests over one records file, on every instruction set
# this machine runs (each a platform: avx512vnni, avx2, portable), one thread, measured
# by wall time (the fastest of many runs) with one job, so that no other measurement
# shares the cores. The workloads are cpu_v2's (make_cpu_v2.sh); what differs is the
# draw: the random tuner takes each layer's plain, blocked and Winograd schedules in turn
# (`CpuTask.strata`), so about a third of every layer's schedules are blocked, where a
# uniform draw gave one in ten.
#   cpu_v3      int8: the tunable ops of ResNet-18 and MobileNet-v1, 16 random
#               convolutions and 8 random grouped ones (half depthwise);
#   cpu_f32_v3  float32: ResNet-18's, and the same random convolutions and grouped ones
#               as float layers. MobileNet-v1 float32 is held out: bench/tuner_model.py
#               tunes it as a model the set never measured at that precision.
# ResNet-50 is held out of both. Resumable; the records are kept xz-compressed. Extra
# arguments go to both runs.
exec sh "$(dirname "$0")/cpu_set.sh" v3 "$@"
