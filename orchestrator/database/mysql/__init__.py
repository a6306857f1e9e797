"""The MariaDB/MySQL SQL behind database/mariadb.py: sessions (session.py), grants, GTID positions, the replica,
the switch, the seed and its tunnel, the chunked comparison."""
