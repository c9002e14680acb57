"""Breaks the contract as MODE says: "count" answers two responses for one
request, "shape" an output of the wrong shape, "name" an undeclared output,
"error" a response carrying an error, "ok" a right answer."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0].decode()
        good = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", np.ones(2, dtype=np.float32))])
        if mode == "count":
            return [good, good]
        if mode == "shape":
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", np.ones(3, dtype=np.float32))])]
        if mode == "name":
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OTHER", np.ones(2, dtype=np.float32))])]
        if mode == "error":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("the input is not a cat", pb_utils.TritonError.INVALID_ARG))]
        return [good]
