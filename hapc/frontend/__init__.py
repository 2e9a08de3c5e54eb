"""From a model file to the IR: load the user's file, trace it with torch.export, make it
functional, find repeated blocks, and record the torch facts the plan depends on.
``frontend/cache/`` keeps traces between runs so that a second compile skips torch."""
