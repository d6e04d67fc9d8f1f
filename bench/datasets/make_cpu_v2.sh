#!/bin/sh
# The CPU target's training set, two manifests over one records file, on
# every instruction set this machine runs (each a platform: avx512vnni, avx2, portable),
# one thread, measured by wall time (the fastest of many runs) with one job, so that no
# other measurement shares the cores:
#   cpu_v2      int8: the tunable ops of ResNet-18 and MobileNet-v1, 16 random
#               convolutions and 8 random grouped ones (half depthwise);
#   cpu_f32_v2  float32: ResNet-18's, and the same random convolutions and grouped ones
#               as float layers. MobileNet-v1 float32 is held out: bench/tuner_model.py
#               tunes it as a model the set never measured at that precision.
# ResNet-50 is held out of both; make_cpu_test_v2.sh measures its layers. Resumable; the
# records are kept xz-compressed. Extra arguments go to both runs. Since the layout and Winograd became knobs the
# random tuner draws a layer's plain, blocked and Winograd schedules in turn
# (`CpuTask.strata`), so a new run draws other schedules than this set holds.
exec sh "$(dirname "$0")/cpu_set.sh" v2 "$@"
