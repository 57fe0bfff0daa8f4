"""An ONNX graph on ONNX Runtime inside Triton's Python backend (CPU).

For Triton builds without the onnxruntime backend (PyTriton's bundled server has only the Python
backend): runs ``model.onnx`` beside this file on the requests Triton batched, one session per
instance. Inputs/outputs are the graph's own; batched requests are concatenated on axis 0.

Written by hrm-deploy (hrm_deploy/serve/triton_models/ort_model.py); self-contained on purpose.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        threads = config.get("parameters", {}).get("intra_op_threads", {}).get("string_value")
        if threads:
            options.intra_op_num_threads = int(threads)
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        sizes, feeds = [], {n: [] for n in self.inputs}
        for request in requests:
            for n in self.inputs:
                feeds[n].append(pb_utils.get_input_tensor_by_name(request, n).as_numpy())
            sizes.append(len(feeds[self.inputs[0]][-1]))
        # puzzle_identifiers / reset travel as [B, 1] in Triton (a batched input needs a dim) and [B] in the graph
        batch = {n: np.concatenate(v) for n, v in feeds.items()}
        for n in ("puzzle_identifiers", "reset"):
            if n in batch and batch[n].ndim == 2:
                batch[n] = batch[n].reshape(-1)
        results = dict(zip(self.outputs, self.session.run(self.outputs, batch)))
        responses, start = [], 0
        for n in sizes:
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(name, np.ascontiguousarray(value[start : start + n]))
                        for name, value in results.items()
                    ]
                )
            )
            start += n
        return responses
