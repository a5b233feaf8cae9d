"""PostgreSQL: the engine and transactions, the tables, the migrations and the audit rows."""
