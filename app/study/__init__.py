"""``raptb study``: a study file (spec), its runs (plan), their directories (state), a parallel
resumable runner (run), and the report (report: runs.csv and table.md; plots)."""
