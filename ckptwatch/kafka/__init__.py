"""Kafka transport for fleet mode (kafka-python), kept apart from the stages it links.

* :mod:`.configuration` client settings from :class:`ckptwatch.config.KafkaSettings`
* :mod:`.admin`         topics created if missing
* :mod:`.producer`      an idempotent ``acks=all`` publisher that waits out a broker outage
* :mod:`.consumer`      a consumer-group member with explicit offset commits
* :mod:`.codec`         the wire format of the events, incidents and saves topics, each field checked
* :mod:`.dead_letters`  the dead-letter topic, where the sink keeps what it could not take

Detectors, rules and ingest never import this package; :mod:`ckptwatch.services` does.
"""
