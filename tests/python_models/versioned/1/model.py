"""Answers with the version it was loaded as: poll-mode tests see which
version served each request."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = np.array([int(args["model_version"])], dtype=np.int32)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("VERSION", self.version)]) for _ in requests]
