#!/bin/sh
# The CPU target's training rows from a second kind of machine: cpu_v3's workloads and
# draw (make_cpu_v3.sh: ResNet-18's and MobileNet-v1's layers, 16 random convolutions
# and 8 grouped ones, int8; ResNet-18's and the random ones at float32; seed 0), measured
# on an AMD EPYC whose hypervisor shows AVX2 and FMA only (no AVX-512, no AMX), on its
# avx2 platform alone (--platforms 1: the platform this machine kind adds; portable C
# is measured in cpu_v3). Its manifests hold the machine model measured there (`vdla
# targets` prints it): the figures cpu_v3's manifests were given when the machine model
# came after them (the same Zen 4 class core), so these rows are the same kind's avx2
# schedules measured again on another host, one whose CPU flags show no AVX-512.
#   cpu_v4      int8;   cpu_f32_v4  float32 (MobileNet-v1 float32 held out, as in v3).
# ResNet-50 is held out of both. Resumable; the records are kept xz-compressed. Extra
# arguments go to both runs.
exec sh "$(dirname "$0")/cpu_set.sh" v4 --platforms 1 "$@"
