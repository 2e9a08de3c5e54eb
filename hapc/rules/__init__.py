"""Op sharding rules: the registry, spec generators, one ``ops_*`` module per op family, and
the checker (``python -m hapc.rules check``) that validates every rule against the unsharded op."""

from hapc.rules.registry import Rule, Sample, Strategy, has_rule, register, replicated, rules, strategies

__all__ = ["Rule", "Sample", "Strategy", "has_rule", "register", "replicated", "rules", "strategies"]
