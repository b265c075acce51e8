"""The few-rows GEMM routes tree_kernels.linear takes by default: none committed yet (SOURCE None)."""

SOURCE = None
TABLE: dict = {}
