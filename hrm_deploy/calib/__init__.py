"""Precision transforms of exported graphs: FP16/BF16 with float32 islands, INT8 Q/DQ with calibration."""
