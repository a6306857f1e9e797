"""The database seam: `protocol.py` (the `Database` protocol, its `Session`, the one `DatabaseError`), `engines.py`
(the registry and factory chosen by the plan's `database.engine`) and one module per engine (`mariadb.py`)."""
