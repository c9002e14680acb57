"""Its own metrics: requests counted, the last input's size as a gauge, and
the input's sum in a histogram, on the server's metrics port."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests = pb_utils.MetricFamily(
            name="custom_requests_total", description="Requests this model answered", kind=pb_utils.MetricFamily.COUNTER
        ).Metric(labels=labels)
        self.size = pb_utils.MetricFamily(
            name="custom_last_input_size", description="Elements in the last input", kind=pb_utils.MetricFamily.GAUGE
        ).Metric(labels=labels)
        self.sums = pb_utils.MetricFamily(
            name="custom_input_sum", description="Sums of the inputs", kind=pb_utils.MetricFamily.HISTOGRAM
        ).Metric(labels=labels, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.requests.increment(1)
            self.size.set(data.size)
            self.sums.observe(float(data.sum()))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", data.astype(np.float32))]))
        return responses
