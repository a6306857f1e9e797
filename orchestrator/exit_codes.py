"""Exit codes of `migrate`, documented in docs/guide.md."""

OK = 0  # done (or nothing to do)
FAILED = 1  # the migration failed and was rolled back: the source serves as before
BAD_INPUT = 2  # bad plan, arguments or missing secret: nothing was changed anywhere
REFUSED = 3  # refused: the plan is locked by a live run, the plan changed since the run began, or not confirmed
NEEDS_ATTENTION = 4  # failed after the DNS flip (resume with `apply`) or a compensation failed (re-run `rollback`)
INTERNAL = 70  # a defect in migrate itself (EX_SOFTWARE); the journal still tells where the run stands
INTERRUPTED = 130  # interrupted outside a run (Ctrl-C)
