"""Rules: log fingerprints kept as data (``packs/*.yaml``), applied to record batches.

See :mod:`ckptwatch.rules.engine` for the rule file format.
"""

from ckptwatch.rules.engine import Rule, RuleError, RuleSet, check_rule_files

__all__ = ["Rule", "RuleError", "RuleSet", "check_rule_files"]
