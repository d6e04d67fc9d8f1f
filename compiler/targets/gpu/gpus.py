"""GPUs by name: the datasheet peaks a roofline estimate divides by (`vdla roofline`).

Each `Gpu` holds four peaks and the DRAM bandwidth as NVIDIA publishes them, and where
each figure comes from. The tensor-core figures are *dense*: NVIDIA's datasheets for
Ampere and later quote tensor throughput "with sparsity" (2:4 structured sparsity, twice
the dense rate); those are halved here, and the entry's `source` says so. FP16 is the
rate with FP32 accumulation (what a Triton ``tl.dot`` of fp16 operands accumulates in);
FP32 is the CUDA cores' IEEE rate, not TF32 (a dot at ``input_precision="ieee"``).

    get("H100-SXM").peak("int8")   # 1.979e15 operations per second
    names()                        # ('h100-sxm', 'h100-pcie', 'h200', ...)

Nothing here imports a GPU library: the estimate runs on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUS", "Gpu", "PRECISIONS", "get", "names"]

#: The precisions a `Gpu` has a peak for: int8 and float16 on the tensor cores, float32
#: on the CUDA cores.
PRECISIONS = ("int8", "float16", "float32")


@dataclass(frozen=True)
class Gpu:
    """One GPU's published peaks.

    name : the key users type (lower case), e.g. ``"h100-sxm"``
    title : the product as NVIDIA names it, e.g. ``"NVIDIA H100 SXM5 80GB"``
    int8_tops : dense INT8 tensor-core tera-operations per second (no sparsity)
    fp16_tflops : dense FP16 tensor-core TFLOPS with FP32 accumulation (no sparsity)
    fp32_tflops : FP32 TFLOPS of the CUDA cores (IEEE fp32, no TF32): what elementwise
        kernels and an ieee-precision fp32 dot run at
    bandwidth_gbs : DRAM bandwidth in GB/s (10^9 bytes per second, as datasheets count)
    source : the document and URL the figures come from, and which were halved from a
        with-sparsity figure
    """

    name: str
    title: str
    int8_tops: float
    fp16_tflops: float
    fp32_tflops: float
    bandwidth_gbs: float
    source: str

    def __post_init__(self):
        for field in ("int8_tops", "fp16_tflops", "fp32_tflops", "bandwidth_gbs"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"GPU {self.name!r}: {field} must be a positive number, "
                                 f"not {value!r}")

    def peak(self, precision: str) -> float:
        """Peak operations per second at `precision` (one of `PRECISIONS`; a
        multiply-accumulate is two operations)."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not "
                             f"{precision!r}")
        tera = {"int8": self.int8_tops, "float16": self.fp16_tflops,
                "float32": self.fp32_tflops}[precision]
        return tera * 1e12

    @property
    def bandwidth(self) -> float:
        """DRAM bandwidth in bytes per second."""
        return self.bandwidth_gbs * 1e9


_H100_DATASHEET = ("NVIDIA H100 Tensor Core GPU datasheet, "
                   "https://resources.nvidia.com/en-us-tensor-core/"
                   "nvidia-tensor-core-gpu-datasheet")
_HALVED = "tensor figures there are stated with sparsity ({}); halved here"

#: The GPUs, by `Gpu.name`.
GPUS: dict[str, Gpu] = {gpu.name: gpu for gpu in [
    Gpu("h100-sxm", "NVIDIA H100 SXM5 80GB", int8_tops=1979, fp16_tflops=989.5,
        fp32_tflops=67, bandwidth_gbs=3350,
        source=f"{_H100_DATASHEET} (H100 SXM column: FP32 67 TFLOPS, 3.35 TB/s); "
               + _HALVED.format("FP16 1,979 TFLOPS, INT8 3,958 TOPS")),
    Gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", int8_tops=1513, fp16_tflops=756.5,
        fp32_tflops=51, bandwidth_gbs=2000,
        source=f"{_H100_DATASHEET} (H100 PCIe column: FP32 51 TFLOPS, 2 TB/s); "
               + _HALVED.format("FP16 1,513 TFLOPS, INT8 3,026 TOPS")),
    Gpu("h200", "NVIDIA H200 SXM 141GB", int8_tops=1979, fp16_tflops=989.5,
        fp32_tflops=67, bandwidth_gbs=4800,
        source="NVIDIA H200 Tensor Core GPU datasheet, https://nvdam.widen.net/s/"
               "nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446, and "
               "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: FP32 67 TFLOPS, "
               "4.8 TB/s; the H100 SXM's compute); "
               + _HALVED.format("FP16 1,979 TFLOPS, INT8 3,958 TOPS")),
    Gpu("a100-sxm", "NVIDIA A100 SXM4 80GB", int8_tops=624, fp16_tflops=312,
        fp32_tflops=19.5, bandwidth_gbs=2039,
        source="NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/"
               "en-zz/Solutions/Data-Center/a100/pdf/"
               "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (A100 80GB SXM: FP32 "
               "19.5 TFLOPS, FP16 tensor 312 TFLOPS, INT8 tensor 624 TOPS, 2,039 GB/s; it "
               "states dense and with-sparsity figures apart, the dense ones used)"),
    Gpu("l4", "NVIDIA L4 24GB", int8_tops=242.5, fp16_tflops=121, fp32_tflops=30.3,
        bandwidth_gbs=300,
        source="NVIDIA L4 Tensor Core GPU datasheet, "
               "https://www.nvidia.com/en-us/data-center/l4/ (FP32 30.3 TFLOPS, 300 GB/s); "
               + _HALVED.format("FP16 242 TFLOPS, INT8 485 TOPS")),
    Gpu("t4", "NVIDIA T4 16GB", int8_tops=130, fp16_tflops=65, fp32_tflops=8.1,
        bandwidth_gbs=320,
        source="NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/"
               "en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf "
               "(single precision 8.1 TFLOPS, mixed precision FP16/FP32 65 TFLOPS, INT8 "
               "130 TOPS, 320 GB/s; Turing has no structured sparsity: all dense)"),
    Gpu("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", int8_tops=660.6, fp16_tflops=165.2,
        fp32_tflops=82.6, bandwidth_gbs=1008,
        source="NVIDIA Ada GPU Architecture whitepaper, https://images.nvidia.com/aem-dam/"
               "Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf (GeForce RTX 4090: "
               "FP32 82.6 TFLOPS, FP16 tensor with FP32 accumulate 165.2 TFLOPS, INT8 "
               "tensor 660.6 TOPS, 1,008 GB/s; the dense figures of its dense/sparse "
               "pairs. GeForce runs FP32 accumulation at half the FP16-accumulate rate)"),
]}


def names() -> tuple[str, ...]:
    """The known GPUs' names, in table order."""
    return tuple(GPUS)


def get(name: str) -> Gpu:
    """The GPU called `name` (any case); ValueError listing the known GPUs otherwise."""
    gpu = GPUS.get(str(name).strip().lower())
    if gpu is None:
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(names())}")
    return gpu
