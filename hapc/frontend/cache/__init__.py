"""The trace cache: keys and source stamps that say when a stored trace is still the model's
(:mod:`~hapc.frontend.cache.keys`, :mod:`~hapc.frontend.cache.sources`), the store on disk and its
restricted pickle format (:mod:`~hapc.frontend.cache.store`, :mod:`~hapc.frontend.cache.irpickle`),
and the child process that traces before the parent has imported torch."""
