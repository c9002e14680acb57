"""A decoupled model in the style of Triton's vLLM backend: execute hands
each request to a thread of its own and returns at once, so its one
instance streams many requests together. Each response carries its index
and how many requests the model had open when it was sent (OPEN). EXIT
makes the stub exit, with every open request unfinished; HANG makes
execute hang."""

import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().flat[0]


class TritonPythonModel:
    def initialize(self, args):
        self.lock = threading.Lock()
        self.open = 0

    def execute(self, requests):
        for request in requests:
            if _scalar(request, "EXIT"):
                os._exit(3)
            if _scalar(request, "HANG"):
                time.sleep(3600)
            count = int(_scalar(request, "COUNT"))
            delay = int(_scalar(request, "DELAY_MS")) / 1000
            with self.lock:
                self.open += 1
            sender = request.get_response_sender()
            threading.Thread(target=self._stream, args=(request, sender, count, delay), daemon=True).start()
        return None

    def _stream(self, request, sender, count, delay):
        try:
            for index in range(count):
                if request.is_cancelled():
                    break
                time.sleep(delay)
                with self.lock:
                    open_now = self.open
                outputs = [
                    pb_utils.Tensor("INDEX", np.array([index], dtype=np.uint32)),
                    pb_utils.Tensor("OPEN", np.array([open_now], dtype=np.uint32)),
                ]
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
        finally:
            with self.lock:
                self.open -= 1
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
