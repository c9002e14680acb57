"""Asynchronous decoupled business-logic scripting: square_int32 streams
for each element of IN at once; SUM adds every value they streamed."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name="square_int32",
                    requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", np.array([v], dtype=np.int32))],
                ).async_exec(decoupled=True)
                for v in values
            ]
            total = 0
            for stream in await asyncio.gather(*calls):
                for response in stream:
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    for tensor in response.output_tensors():
                        total += int(tensor.as_numpy()[0])
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", np.array([total], dtype=np.int32))]))
        return responses
