"""Task-only libraries are imported when a task that needs them is built or used, never by a
task lookup, the registry's listing or the CLI's construction (in a fresh interpreter, since this
test session has imported them all already)."""

from __future__ import annotations

import json
import subprocess
import sys

TASK_ONLY = ("simplemma", "rdkit", "rapidfuzz", "xgrammar", "sacrebleu")

SCRIPT = f"""
import json, sys
def imported():
    return [m for m in {TASK_ONLY!r} if m in sys.modules]

from raptb.adapters.tasks.registry import task_names, task_spec
task_spec("expr24")
for name in task_names():
    task_spec(name).options()
import typer
from raptb.app.cli import app
typer.main.get_command(app)  # every flag of every command, the task choices included
after_lookups = imported()

# building and using the tasks brings their libraries in (the check can see an import)
from raptb.app.configuration.config import build_config
from raptb.app.task_and_policy import build_task
smiles = build_task(build_config(overrides={{"task": "smiles"}}))
smiles.score(smiles.prompts()[0], "C")
commongen = build_task(build_config(overrides={{"task": "commongen"}}))
commongen.score(commongen.prompts()[0], "A dog runs.")
from raptb.adapters.lm.grammar import compile_grammar
compile_grammar(("a",), 'root ::= "a"')
from raptb.adapters.tasks.amp.metrics import levenshtein_matrix
levenshtein_matrix(["ab"], ["b"])
print(json.dumps([after_lookups, imported()]))
"""


def test_task_libraries_are_imported_at_use_not_at_lookup():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    after_lookups, after_use = json.loads(out.stdout.strip().splitlines()[-1])
    assert after_lookups == []
    assert after_use == list(TASK_ONLY)
