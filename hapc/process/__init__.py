"""Process plumbing every floor may use: forking work onto the spare core, pausing and
freezing the garbage collector. Depends on the standard library only."""
