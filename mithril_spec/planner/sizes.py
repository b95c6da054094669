"""Bytes per element of each dtype and optimizer state tensors per parameter: the constants every planner
module shares."""

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int64": 8}
OPTIMIZER_SLOTS = {"adamw": 2, "adam": 2, "sgd": 1}  # state tensors per parameter (sgd: momentum only)
