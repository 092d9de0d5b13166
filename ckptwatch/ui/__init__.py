"""The local web console: incident list, incident pages and "diagnose a log" in a
browser (:mod:`.app`), served by ``ckptwatch ui`` or beside ``run`` / ``sink`` with
``--ui PORT`` (:mod:`.server`), on 127.0.0.1 unless told otherwise."""
