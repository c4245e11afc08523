"""Benches: the search over a directory of specs, the field's metrics, and the reports.

runner.py    find the specs, one run per spec, resumable; the bench document
results.py   one result row from a finished run (delivered and kernel speedups, roofline, cost)
metrics.py   fast_p, geomean speedups (failures as 1.0, or correct only), correctness rate
report.py    the bench's table (markdown, CSV, JSON), plots (PNG) and one HTML page
imported.py  other systems' results (a KernelBench run's folder), kept as reported, beside a bench
report_imported.py  their report, and the comparison a bench's report shows
"""

from kernelevolve.bench.metrics import summarize
from kernelevolve.bench.runner import bench_document, discover, run_bench

__all__ = ["bench_document", "discover", "run_bench", "summarize"]
