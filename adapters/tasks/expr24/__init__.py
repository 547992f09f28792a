"""Expr24: arithmetic expressions over single digits that evaluate to 24 (``task``) and its
report (``metrics``)."""
