"""What runs: the attention backend vLLM takes for a model and the kernel families it runs
(`engines`), and the checked request that carries model, serving, selection and targets
(`request`). Imports `shapes`, `vllm` and below.
"""
