"""A sequence model: sums its inputs per correlation id, from the START
flag to the END flag, and answers the running total and the flags."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            flags = request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.totals[key] = 0
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            self.totals[key] = self.totals.get(key, 0) + value
            total = self.totals[key]
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.totals[key]
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("TOTAL", np.array([total], dtype=np.int32)),
                        pb_utils.Tensor("FLAGS", np.array([flags], dtype=np.uint32)),
                    ]
                )
            )
        return responses
