"""The package's version: one home that the build reads and every layer may import."""

__version__ = "0.1.0"
