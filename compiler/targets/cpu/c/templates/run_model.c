/* run_model: vdla_model.h's API from a program.
 *   ./run_model model.params IN_0 ... OUT_0 ... [REPEATS]
 * reads each input's raw bytes from a file, runs the model once untimed, then REPEATS
 * times (default 1) each timed on its own, writes each output's raw bytes and prints the
 * median time per run: the model alone, without the process's start or the files. */
/* clock_gettime is POSIX, not C11: -std=c11 declares it only when asked to (without
   -fopenmp nothing else asks) */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "vdla_model.h"

static const size_t in_bytes[] = {@INPUT_BYTES@};
static const size_t out_bytes[] = {@OUTPUT_BYTES@};

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

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
    /* each run timed on its own: the median ignores the runs a busy machine slowed */
    double *ms = malloc(sizeof *ms * (size_t)repeats), sum = 0;
    if (!ms) { fprintf(stderr, "out of memory\n"); return 1; }
    for (int r = 0; r < repeats; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (vdla_model_infer(m, inputs, outputs)) { fprintf(stderr, "run failed\n"); return 1; }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ms[r] = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
        sum += ms[r];
    }
    for (int i = 0; i < @N_OUTPUTS@; i++) {
        FILE *f = fopen(argv[2 + @N_INPUTS@ + i], "wb");
        if (!f || fwrite(outputs[i], 1, out_bytes[i], f) != out_bytes[i]) {
            fprintf(stderr, "cannot write %s\n", argv[2 + @N_INPUTS@ + i]);
            return 1;
        }
        fclose(f);
    }
    qsort(ms, (size_t)repeats, sizeof *ms, by_value);
    double median = repeats % 2 ? ms[repeats / 2] : (ms[repeats / 2 - 1] + ms[repeats / 2]) / 2;
    printf("%.3f ms per run (median of %d run%s; min %.3f, mean %.3f)\n", median, repeats,
           repeats == 1 ? "" : "s", ms[0], sum / repeats);
    free(ms);
    vdla_model_free(m);
    return 0;
}
