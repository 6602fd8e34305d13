"""The target GPU host as the libraries see it, stood in on a builder without that GPU.

`triton_driver`: a Triton driver that reports the target and never touches a GPU, and the device
torch reports for it. `vllm_platform`: vLLM's platform of the target (ROCm or CUDA), under which
vLLM's modules import as they do on that host. Imports `inputs` and below.
"""
