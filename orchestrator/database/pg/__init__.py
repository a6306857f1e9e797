"""PostgreSQL's replicate mode behind the seam (replication.py: the standby, the switch, the seed; compare.py: the
chunked comparison), over the primitives of orchestrator/database/pg/primitives.py."""
