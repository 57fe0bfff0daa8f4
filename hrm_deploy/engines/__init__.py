"""TensorRT and TensorRT-RTX engine builds from precision-carrying ONNX graphs."""
