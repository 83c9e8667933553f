"""PostgreSQL: the engine and embedded server, migrations, the LISTEN connection, every SQL statement."""
