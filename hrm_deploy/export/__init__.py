"""ACT unrolling and ONNX export (FP32, dynamic batch, parity-checked)."""
