"""The Plan: what a synthesis decided (stages, programs, shares, precision), how it is saved
to and loaded from plan.json, and the replan cache written beside it."""

from hapc.plan.plan import Plan

__all__ = ["Plan"]
