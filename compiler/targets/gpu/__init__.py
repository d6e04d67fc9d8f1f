"""The GPU target: the front half's graph, int8 or float, as Triton kernels.

Its data flow, one module per step:

    schedule    the GEMM kernels' knobs (tiles, warps, stages, split-K), their checks,
                the default chooser and the tuner's space
    lower       a node to its kernels' launches (grid, arguments, constants): numpy only;
                `lower_sequence` (transformers' float ops, matmul, qmatmul, gather,
                attention, the elementwise and layout ops) and `lower_integer` (the
                integer softmax, LayerNorm, GELU, attention) for sequence models;
                `launches` what they make (`GpuKernel`, `Launch`, `Ref`)
    codes       the op codes `lower` picks and `kernels` branches on
    kernels     the Triton kernels (implicit-GEMM convolution with its fused epilogue,
                depthwise, pools, elementwise, concat); `sequence_kernels` those of
                sequence models (strided elementwise maps, batched matmul, row softmax
                and LayerNorm and their integer forms, bounds-checked gather)
    runtime     where they run: a CUDA GPU, or Triton's interpreter on the CPU; the
                ``gpu`` extra (Triton, PyTorch) is imported only here and by the session
    target      `GpuTarget` and its session (activations stay in device memory)
    tuning      the tuner's tasks (CUDA-event time of a GEMM schedule)
    gpus        GPUs' datasheet peaks, for
    roofline    per-kernel and per-model estimates when no GPU is at hand

`GpuTarget` is what the rest of vdla uses (`vdla.compiler.targets.get("gpu")`). Outside
the target, ``vdla roofline`` uses this package's public face: `gpus` and `roofline`
(numpy and the GPU table: no Triton).
"""

from vdla.compiler.targets.gpu import gpus, roofline

__all__ = ["gpus", "roofline"]
