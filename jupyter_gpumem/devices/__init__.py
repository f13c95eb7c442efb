"""Where segments come from: a simulated device, a CUDA device through CuPy, NVML's process list,
and pluggable C allocators.
"""
