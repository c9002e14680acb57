"""Decoupled: one response with the final flag, then a send after it,
which pb_utils refuses; the refusal is logged."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            try:
                sender.send(response)
            except pb_utils.TritonModelException as refused:
                pb_utils.Logger.log_error(f"after_final refused: {refused}")
        return None
