"""The trace cache: keys that say when a stored trace is still the model's, the store on disk,
and the child process that traces before the parent has imported torch."""
