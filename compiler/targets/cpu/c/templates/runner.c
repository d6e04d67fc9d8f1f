
/* ---- the whole graph @GRAPH@: @OPS@ ops ---- */
static size_t vdla_max_size(size_t a, size_t b) { return a > b ? a : b; }

size_t vdla_model_params_size(void) { return @PARAMS_SIZE@; }
size_t vdla_model_arena_size(void) { return @ARENA_SIZE@; }
size_t vdla_model_workspace_size(int threads) {
    size_t m = @ALIGN@;
    if (threads < 1) threads = 1;
@WORKSPACE_TERMS@
    return m;
}

static void vdla_tick(struct timespec *t) { clock_gettime(CLOCK_MONOTONIC, t); }
static double vdla_tock(const struct timespec *t0) {
    struct timespec t1; clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* vdla_model_run, and with `seconds` (one double per op, in order) each op's wall time.
   Returns 0, 1 for a NULL argument, or 2 when an op found bad input (an index outside
   its table: `vdla_error` says which; the ops after it did not run). */
int vdla_model_run_timed(const unsigned char *restrict params, unsigned char *restrict arena,
                         unsigned char *restrict ws, const void *const *inputs,
                         void *const *outputs, double *seconds) {
    if (!params || !arena || !ws || !inputs || !outputs) return 1;
    struct timespec t0; (void)t0;
    vdla_holding held; vdla_hold(&held);
    vdla_clear_error();
@CALLS@
    vdla_release(&held);
    return 0;
}

int vdla_model_run(const unsigned char *restrict params, unsigned char *restrict arena,
                   unsigned char *restrict ws, const void *const *inputs,
                   void *const *outputs) {
    return vdla_model_run_timed(params, arena, ws, inputs, outputs, NULL);
}
