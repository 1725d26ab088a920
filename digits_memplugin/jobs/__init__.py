"""Training jobs: the SQLite store, the definition made safe to run, the training child, the manager.

Nothing is re-exported here: the training child (`jobs.child.runner`) is started as ``python -m`` and must not load the
manager's modules (sqlite3, subprocess) on its way in. Import from the submodules.
"""
