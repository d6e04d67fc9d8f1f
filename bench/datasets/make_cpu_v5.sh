#!/bin/sh
# The CPU target's training rows from a third kind of machine: cpu_v3's workloads and
# draw (make_cpu_v3.sh: ResNet-18's and MobileNet-v1's layers, 16 random convolutions
# and 8 grouped ones, int8; ResNet-18's and the random ones at float32; seed 0), measured
# on an Intel Xeon with AMX (2 cores, two 512-bit FMA ports, AVX-512 VNNI, AMX int8 and
# bf16), on its amx platform alone (--platforms 1: the platform this machine kind adds).
# There an int8 convolution that reads its rows in place runs on tiles and makes no
# task; the other int8 layers (stems, grouped and depthwise ones, channels off 64-byte
# steps) and every float32 one run the AVX-512 code, whose schedules these rows measure
# with this machine's model in the manifests (`vdla targets` prints it).
#   cpu_v5      int8;   cpu_f32_v5  float32 (MobileNet-v1 float32 held out, as in v3).
# ResNet-50 is held out of both. Resumable; the records are kept xz-compressed. Extra
# arguments go to both runs.
exec sh "$(dirname "$0")/cpu_set.sh" v5 --platforms 1 "$@"
