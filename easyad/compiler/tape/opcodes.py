"""The tape's opcodes as the compiler reads them (from the rule table, ``easyad._rules``)."""
from __future__ import annotations

from easyad import _rules

RULE_OPCODE = _rules.OPCODES          # rule name -> opcode
_STRUCTURAL = _rules.STRUCTURAL_OPCODES
SELECT_OP = _STRUCTURAL["select"]
# comparison and guard opcodes -> their C operator
COMPARE_OPS = {_STRUCTURAL[f"compare_{c}"]: _rules.COMPARISON_SYMBOLS[c]
               for c in _rules.COMPARISONS}
GUARD_OPS = {_STRUCTURAL[f"guard_{c}"]: _rules.COMPARISON_SYMBOLS[c] for c in _rules.COMPARISONS}
RULE_OF = {code: _rules.RULES_BY_NAME[name] for name, code in RULE_OPCODE.items()}
