"""Y = gelu(X @ W + b) on the instance's GPU, W and b fixed by a seed so
the check can compute the same thing in its own process."""

import json

import numpy as np
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

WIDTH = 1024


def weights(device):
    generator = torch.Generator().manual_seed(43)
    w = torch.randn(WIDTH, WIDTH, generator=generator) / WIDTH**0.5
    b = torch.randn(WIDTH, generator=generator)
    return w.to(device), b.to(device)


def forward(x, w, b):
    return torch.nn.functional.gelu(x @ w + b)


class TritonPythonModel:
    def initialize(self, args):
        if args["model_instance_kind"] != "GPU":
            raise pb_utils.TritonModelException(
                f"torch_mlp runs on a GPU, its instance is {args['model_instance_kind']}"
            )
        self.device = torch.device("cuda", int(args["model_instance_device_id"]))
        self.w, self.b = weights(self.device)
        self.batches = []

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        rows = [x.shape[0] for x in xs]
        # One host-to-device copy for the whole batch.
        x = torch.from_numpy(np.concatenate(xs)).to(self.device)
        y = forward(x, self.w, self.b)
        responses = []
        start = 0
        for n in rows:
            # Triton's idiom for a GPU output: the tensor handed over as
            # DLPack, still on the device (the stub copies it out).
            out = pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(y[start : start + n]))
            if out.is_cpu():
                raise pb_utils.TritonModelException("a CUDA tensor came back as a CPU one")
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            start += n
        return responses
