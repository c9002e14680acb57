"""Counts the requests each instance executed before a client's: warmup
tests read, from the first answer, that warmup ran on this instance before
the model was READY, and with which data.

A request whose TEXT is b"fail" raises: a warmup sample that sends it must
fail the load."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executed = 0
        self.executions = 0
        self.seen_sum = 0.0

    def execute(self, requests):
        self.executions += 1
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            if any(t == b"fail" for t in text.ravel()):
                raise pb_utils.TritonModelException("this warmup sample asks to fail")
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            before = np.array([[self.executed, self.executions - 1]], dtype=np.int64)
            summed = np.array([[self.seen_sum]], dtype=np.float64)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("BEFORE", before), pb_utils.Tensor("SEEN_SUM", summed)]
                )
            )
            self.executed += 1
            self.seen_sum += float(values.sum())
        return responses
