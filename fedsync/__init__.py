"""fedsync: sparsified, quantized, asynchronous federated training on Flower.

The core package is importable without Flower: codecs, wire format, asynchronous
aggregation, staleness, clocks, device and network models, data, models, reports.
"""

__version__ = "0.1.0"
