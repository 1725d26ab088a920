"""The jobs' store: the SQLite database, its records, the data folder's lock, disk and quotas."""
