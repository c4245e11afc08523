"""kernelevolve: search for faster GPU kernels, verified by a harness that cannot be fooled.

Importing this package is cheap: nothing heavy (torch, triton) is imported here. The library's entry
points are `kernelevolve.spec.load_spec`, `kernelevolve.evaluate.EvaluatorPool` and the CLI
(`kernelevolve.cli`).
"""

__version__ = "0.1.0"
