"""Doubles its input and says how many requests its execute got."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        size = np.array([[len(requests)]], dtype=np.int32)
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2),
                    pb_utils.Tensor("BATCH", size),
                ]
            )
            for r in requests
        ]
