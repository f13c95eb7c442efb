"""The caching allocator: PyTorch's policy over any Device, in two cores (Python and C), with
stats, history, config and invariants. Imports only the data layer.
"""
