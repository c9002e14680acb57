"""Its config names only the backend: auto_complete_config declares the
inputs, outputs, batch size and dynamic batching."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        for name in ("INPUT0", "INPUT1"):
            auto_complete_model_config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", (a * b).astype(np.float32))]))
        return responses
