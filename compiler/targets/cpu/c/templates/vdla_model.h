/* @FILE@: the graph @GRAPH@ compiled by vdla's CPU target (@ISA@).
 *
@INPUTS@
@OUTPUTS@
 *
 * All tensors are plain C arrays in row-major order (NCHW for images).
 *
 *     vdla_model *m = vdla_model_load("model.params", 0);   // 0: OpenMP's threads
 *     vdla_model_infer(m, inputs, outputs);                 // arrays of pointers
 *     vdla_model_free(m);
 *
 * or, with buffers of your own (no allocation, no file):
 *
 *     vdla_model_run(params, arena, ws, inputs, outputs);
 *
 * where params holds vdla_model_params_size() bytes (the params file after its 16-byte
 * header), arena vdla_model_arena_size() and ws vdla_model_workspace_size(threads)
 * bytes, each 64-byte aligned. Functions return 0 on success.
 */
#ifndef @GUARD@
#define @GUARD@

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VDLA_MODEL_INPUTS @N_INPUTS@
#define VDLA_MODEL_OUTPUTS @N_OUTPUTS@
@SIZE_MACROS@
size_t vdla_model_params_size(void);
size_t vdla_model_arena_size(void);
size_t vdla_model_workspace_size(int threads);
int vdla_model_run(const unsigned char *params, unsigned char *arena, unsigned char *ws,
                   const void *const *inputs, void *const *outputs);
/* the same, the wall time of each step in seconds[] (one per op in the graph's order,
   and one per layout conversion between them: VDLA_MODEL_STEPS in all) */
int vdla_model_run_timed(const unsigned char *params, unsigned char *arena,
                         unsigned char *ws, const void *const *inputs,
                         void *const *outputs, double *seconds);
void vdla_set_threads(int threads);
/* OpenMP's worker threads pinned one per core but `caller` (-1: the calling thread's
   current one), which it returns (vdla_model_load does this); while a run lasts the
   calling thread is held on that core, and let go after. */
int vdla_pin_workers(int caller);

typedef struct vdla_model vdla_model;
/* Reads the params file; NULL (and a message on stderr) if it is missing or not this
   model's. threads: OpenMP threads (0: OpenMP's default). */
vdla_model *vdla_model_load(const char *params_path, int threads);
int vdla_model_infer(vdla_model *model, const void *const *inputs, void *const *outputs);
void vdla_model_free(vdla_model *model);

#ifdef __cplusplus
}
#endif
#endif
