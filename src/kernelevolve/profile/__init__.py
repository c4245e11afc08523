"""Profiling and diagnosis. Issue A provides the roofline; profilers (ncu, torch.profiler) come next."""
