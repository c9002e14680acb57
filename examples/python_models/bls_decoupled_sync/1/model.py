"""Decoupled business-logic scripting: streams square_int32's answers to
IN, each as the running sum of those so far, then the final flag."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            call = pb_utils.InferenceRequest(
                model_name="square_int32",
                requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
            )
            total = 0
            for response in call.exec(decoupled=True):
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=response.error()))
                    break
                if not response.output_tensors():
                    continue
                total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", np.array([total], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
