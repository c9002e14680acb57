"""Answers with what pb_utils lets a model read: REQUEST is the request's
metadata as JSON, ARGS what initialize got, ECHO the input through
Tensor's numpy, dlpack and config helpers. The response's parameters say
whom it answered, in each type a parameter may have."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.args["greeting"] = config["parameters"]["greeting"]["string_value"]
        self.args["input_dims"] = pb_utils.get_input_config_by_name(config, "INPUT0")["dims"]
        self.echo_dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "ECHO")["data_type"])
        pb_utils.Logger.log_info(f"inspect initialized as {args['model_instance_name']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            echoed = pb_utils.Tensor.from_dlpack("ECHO", tensor.to_dlpack())
            seen = {
                "id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "parameters": json.loads(request.parameters()),
                "requested": sorted(request.requested_output_names()),
                "inputs": [t.name() for t in request.inputs()],
                "is_cpu": tensor.is_cpu(),
                "cancelled": request.is_cancelled(),
                "shape": list(tensor.as_numpy().shape),
                "timeout": request.timeout(),
            }
            pb_utils.Logger.log_warn(f"inspect saw request '{request.request_id()}'")
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("REQUEST", np.array([json.dumps(seen).encode()], dtype=np.object_)),
                        pb_utils.Tensor("ECHO", echoed.as_numpy().astype(self.echo_dtype)),
                        pb_utils.Tensor("ARGS", np.array([json.dumps(self.args)], dtype=np.object_)),
                    ],
                    parameters={"answered": request.request_id(), "inputs": len(request.inputs()), "echoed": True},
                )
            )
        return responses
