"""Business-logic scripting, asynchronous: the model named in MODEL_NAME
computes OUTPUT0 and OUTPUT1 in two concurrent calls (async_exec), each
asking for one of them."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            model = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0].decode()
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            calls = [
                pb_utils.InferenceRequest(model_name=model, requested_output_names=[name], inputs=inputs).async_exec()
                for name in ("OUTPUT0", "OUTPUT1")
            ]
            first, second = await asyncio.gather(*calls)
            failed = next((r for r in (first, second) if r.has_error()), None)
            if failed is not None:
                responses.append(pb_utils.InferenceResponse(error=failed.error()))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(second, "OUTPUT1"),
                    ]
                )
            )
        return responses
