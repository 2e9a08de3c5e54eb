"""The profiler: measures a real machine and writes a cluster file; checks the cost model.

Where things live:

* :mod:`profiler.profile` — ``hapc profile``: start the ranks, measure, fit, write the file;
* :mod:`profiler.workers` — what every rank runs (spawned here, or under torchrun);
* :mod:`profiler.device` — matmul FLOPS per dtype, memory bandwidth, op launch overhead;
* :mod:`profiler.opclass_bench` — efficiency per op class, solved through the roofline;
* :mod:`profiler.comm` — collective timings; :mod:`profiler.fit` — alpha-beta per link;
* :mod:`profiler.clusterfile` — measured numbers -> a new or merged cluster file;
* :mod:`profiler.pin` / :mod:`profiler.launch` — pinning ranks to cores, running emitted programs;
* :mod:`profiler.testbed` — the heterogeneous CPU testbed (``scripts/hetero_testbed.sh``).

Calibration against measured runs (``hapc calibrate``) is :mod:`profiler.calibrate`.
"""
