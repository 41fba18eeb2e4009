"""Structured state space models from first principles to fast GPU kernels."""
__version__ = "0.1.0"
