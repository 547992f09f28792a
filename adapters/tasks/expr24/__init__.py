"""Expr24: arithmetic expressions over single digits that evaluate to 24: the task (``task``),
its report (``metrics``) and registry entry (``spec``)."""
