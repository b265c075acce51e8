"""Row-wise elementwise work of a decoder layer (norms, GDN gates): references and Triton kernels."""
