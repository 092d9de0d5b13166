"""The incident history, read: opening it while a pipeline writes it (:mod:`.read`), the
questions asked of it (:mod:`.queries`) and its command line (:mod:`.cli`).

Downstream of the sinks: it reads what they wrote and never writes a database.
"""
