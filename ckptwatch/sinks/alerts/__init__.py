"""Alert delivery (issue 4, in progress): shared stages first, one module per channel later.

* :mod:`.redact`  secrets removed from log lines before they leave the machine
"""
