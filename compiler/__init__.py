"""Model compiler: graph IR, ONNX import, quantization and passes (front half), and the
accelerator, CPU and GPU back halves. Arrives with the compiler issues; the hand-written
kernels of `vdla.runtime.kernels` show the programs its back half will generate."""
