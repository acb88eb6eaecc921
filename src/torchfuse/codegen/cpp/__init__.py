"""The C++ renderer: fused kernels as OpenMP C++ functions, one translation unit per graph."""
