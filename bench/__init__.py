"""Benchmarks (``make bench``) and golden plans (``make golden``).

Not part of the library: these scripts measure hapc (synthesis time, plan quality, the
emitted program's speed) and keep the plans CI compares against. Each ``bench.<section>``
module runs on its own (``python -m bench.synthesis``) and merges its figures into
``bench/results.json``; ``bench.render`` turns that file into ``BENCHMARKS.md``.
"""
