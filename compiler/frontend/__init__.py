"""Where graphs come from and go to: ONNX import and export, the model zoo and the
builder behind it, single-layer workloads, and the small data sets of the trained model.

* `onnx_import.from_onnx` / `onnx_export.to_onnx`: ONNX in and out (onnx is imported
  only by these modules, on first use);
* `zoo.get(name)`: built-in models with seeded weights, and the trained digits CNN
  (`models/`); `builder.GraphBuilder` builds them;
* `workloads`: ResNet-18's benchmark convolutions, each as a one-node quantized graph;
* `datasets`: the digits data set.
"""
