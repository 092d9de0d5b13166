"""The stages as fleet services, linked by Kafka (``ckptwatch collect | detect | sink``).

Each service is the embedded pipeline's stage code (ingest, rules, detectors, the DuckDB
store) with a Kafka link on either side; each has a ``step()`` that does one unit of work and
makes its progress durable before returning, so ``kill -9`` between two steps, or inside
one, loses nothing:

* :mod:`.collect` files -> events topic; source offsets saved after the broker acknowledged.
* :mod:`.detect`  events topic (consumer group) -> incidents topic; offsets committed after
  the incidents are acknowledged; state rebuilt by replaying the partition on assignment.
* :mod:`.sink`    both topics -> DuckDB; offsets committed after the DuckDB transaction.
* :mod:`.loop`    runs steps until idle, interrupted, or for ever.
"""
