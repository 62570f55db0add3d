"""Support code every part may use: errors, logging, records, digests, lazy imports and
the configuration read from the environment. It imports nothing else of TensorWasm."""
