"""Business-logic scripting, blocking: sends INPUT0 and INPUT1 to the model
named in MODEL_NAME and answers with its OUTPUT0 and OUTPUT1, or with its
error."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0].decode()
            call = pb_utils.InferenceRequest(
                model_name=model,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            response = call.exec()
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(response, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(response, "OUTPUT1"),
                    ]
                )
            )
        return responses
