"""Decoupled: one response per element of IN (OUT the element, IDX its
position), DELAY[i] milliseconds apart, sent from a thread of its own; the
final flag WAIT milliseconds after the last."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            if len(values) != len(delays):
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("IN and DELAY must have the same length", pb_utils.TritonError.INVALID_ARG)
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            thread = threading.Thread(target=self.stream, args=(request.get_response_sender(), values, delays, int(wait[0])))
            thread.start()
            self.threads.append(thread)
        return None

    def stream(self, sender, values, delays, wait):
        for index, (value, delay) in enumerate(zip(values, delays)):
            time.sleep(delay / 1000)
            if sender.is_cancelled():
                break
            sender.send(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                        pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                    ]
                )
            )
        time.sleep(wait / 1000)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
