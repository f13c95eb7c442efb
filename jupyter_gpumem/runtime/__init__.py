"""Which allocator is current for each device and backend, and installing ours into CuPy.
"""
