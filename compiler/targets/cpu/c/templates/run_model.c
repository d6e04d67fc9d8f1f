/* run_model: vdla_model.h's API from a program.
 *   ./run_model model.params IN_0 ... OUT_0 ... [REPEATS]
 * reads each input's raw bytes from a file, runs the model REPEATS times (default 1),
 * writes each output's raw bytes, prints the mean time per run (after one untimed run). */
/* clock_gettime is POSIX, not C11: -std=c11 declares it only when asked to (without
   -fopenmp nothing else asks) */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "vdla_model.h"

static const size_t in_bytes[] = {@INPUT_BYTES@};
static const size_t out_bytes[] = {@OUTPUT_BYTES@};

int main(int argc, char **argv) {
    if (argc < 2 + @FILES@) {
        fprintf(stderr, "usage: %s model.params@USAGE@ [REPEATS]\n", argv[0]);
        return 2;
    }
    vdla_model *m = vdla_model_load(argv[1], 0);
    if (!m) return 1;
    const void *inputs[@INPUT_SLOTS@]; void *outputs[@OUTPUT_SLOTS@];
    for (int i = 0; i < @N_INPUTS@; i++) {
        void *buf = malloc(in_bytes[i]);
        FILE *f = fopen(argv[2 + i], "rb");
        if (!f || fread(buf, 1, in_bytes[i], f) != in_bytes[i]) {
            fprintf(stderr, "cannot read %zu bytes from %s\n", in_bytes[i], argv[2 + i]);
            return 1;
        }
        fclose(f);
        inputs[i] = buf;
    }
    for (int i = 0; i < @N_OUTPUTS@; i++) outputs[i] = malloc(out_bytes[i]);
    int repeats = argc > 2 + @FILES@ ? atoi(argv[2 + @FILES@]) : 1;
    if (repeats < 1) repeats = 1;
    /* one run first: it starts OpenMP's threads and touches every buffer */
    if (vdla_model_infer(m, inputs, outputs)) { fprintf(stderr, "run failed\n"); return 1; }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < repeats; r++)
        if (vdla_model_infer(m, inputs, outputs)) { fprintf(stderr, "run failed\n"); return 1; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 0; i < @N_OUTPUTS@; i++) {
        FILE *f = fopen(argv[2 + @N_INPUTS@ + i], "wb");
        if (!f || fwrite(outputs[i], 1, out_bytes[i], f) != out_bytes[i]) {
            fprintf(stderr, "cannot write %s\n", argv[2 + @N_INPUTS@ + i]);
            return 1;
        }
        fclose(f);
    }
    printf("%.3f ms per run (%d runs)\n",
           ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6) / repeats, repeats);
    vdla_model_free(m);
    return 0;
}
