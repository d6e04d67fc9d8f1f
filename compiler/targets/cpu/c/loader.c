/* vdla_model_load & co.: the params file, an arena and a workspace. */
/* posix_memalign is POSIX, not C11: -std=c11 declares it only when asked to (gcc 14
   refuses an undeclared function) */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "vdla_model.h"

struct vdla_model {
    unsigned char *params, *arena, *ws;
};

static void *vdla_alloc(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) == 0 ? p : NULL;
}

vdla_model *vdla_model_load(const char *path, int threads) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "vdla_model_load: cannot open %s\n", path); return NULL; }
    char magic[8]; uint64_t size = 0;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "VDLAPRM1", 8) != 0
            || fread(&size, 8, 1, f) != 1 || size != vdla_model_params_size()) {
        fprintf(stderr, "vdla_model_load: %s is not this model's params file (expected %zu "
                        "bytes of params)\n", path, vdla_model_params_size());
        fclose(f); return NULL;
    }
    vdla_model *m = calloc(1, sizeof *m);
    if (threads > 0) vdla_set_threads(threads);
    vdla_pin_workers(-1);   /* OpenMP's workers one per core; see model.c */
    int workers = threads > 0 ? threads : 1;
#ifdef _OPENMP
    if (threads <= 0) { extern int omp_get_max_threads(void); workers = omp_get_max_threads(); }
#endif
    m->params = vdla_alloc(size);
    m->arena = vdla_alloc(vdla_model_arena_size());
    m->ws = vdla_alloc(vdla_model_workspace_size(workers));
    if (!m->params || !m->arena || !m->ws || fread(m->params, 1, size, f) != size) {
        fprintf(stderr, "vdla_model_load: cannot read %s\n", path);
        fclose(f); vdla_model_free(m); return NULL;
    }
    fclose(f);
    return m;
}

int vdla_model_infer(vdla_model *m, const void *const *inputs, void *const *outputs) {
    return m ? vdla_model_run(m->params, m->arena, m->ws, inputs, outputs) : 1;
}

void vdla_model_free(vdla_model *m) {
    if (!m) return;
    free(m->params); free(m->arena); free(m->ws); free(m);
}
