"""Decoupled: IN = n gets n responses, each OUT = n, from execute itself;
IN = 0 gets only the final flag."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
