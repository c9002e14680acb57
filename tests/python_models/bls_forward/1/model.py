"""Forwards INPUT0 and INPUT1 to the model named in MODEL_NAME, whatever
serves it (ONNX Runtime, an ensemble, another server), and answers with
its OUTPUT0 and OUTPUT1, or with its error."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0].decode()
            answer = pb_utils.InferenceRequest(
                model_name=model,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            ).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
