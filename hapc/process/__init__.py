"""Process plumbing every floor may use. Depends on the standard library only.

* :mod:`hapc.process.fork`: work in a forked child on the spare core (:class:`~hapc.process.fork.Beside`,
  :class:`~hapc.process.fork.BesideEach`); the only module that calls ``os.fork``.
* :mod:`hapc.process.sharedjobs`: a list of jobs worked from both ends by this process and a child.
* :mod:`hapc.process.collector`: the cyclic garbage collector paused, frozen, or frozen at exit.
"""
