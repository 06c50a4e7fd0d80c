"""qformat benchmark harness: ``python -m bench`` (see docs/performance.md).

Every figure is measured in one run, on the same data, as the median of several repetitions,
and quoted as a ratio to a baseline measured in that run: NumPy memcpy (``np.copyto`` into a
preallocated array) of the decoded output's size.  Speed is asserted here (the ``target``
rows), never in unit tests; tests/test_bench_smoke.py runs a seconds-long ``--quick`` pass so
the harness cannot rot.
"""
