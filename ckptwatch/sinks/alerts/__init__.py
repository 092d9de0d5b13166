"""Alerting: incidents -> Slack, PagerDuty, webhooks and the console, each once (delivery is at
least once; duplicates are rare, folded by idempotency keys or marked: see :mod:`.dispatcher`).

Laid out like Alertmanager's notification pipeline: one module per channel, the shared
stages written once beside them.

Channels (render a notification in their API's format, send it once):

* :mod:`.slack`      incoming webhook, Block Kit, within Slack's limits
* :mod:`.pagerduty`  Events API v2 trigger / resolve, dedup key = incident id
* :mod:`.webhook`    the incident as JSON, ``Idempotency-Key``, optional HMAC-SHA256 signature
* :mod:`.alertmanager`  Alertmanager API v2 alerts (grouping, inhibition, routing, receivers
                        are Alertmanager's), re-posted while firing, ended on resolve
* :mod:`.console`    the text report on stdout (the embedded default)

Shared stages:

* :mod:`.settings`          ``[alerts.channels.*]`` / ``[[alerts.silences]]`` tables, secrets
* :mod:`.routing`           incident labels, severity order, routes
* :mod:`.silences`          silences from config and from ``ckptwatch silence``
* :mod:`.dedup`             what one channel must be told about one incident version
* :mod:`.notification_log`  the DuckDB outbox and alert log (table ``alerts``)
* :mod:`.http`              one POST (connect / read timeouts) and what its answer means
                             (sent / retry / maybe delivered / rejected)
* :mod:`ckptwatch.sinks.redact`  secrets removed from every string of an incident before it leaves
                             the machine (the dispatcher redacts each incident once, for all channels)
* :mod:`.dispatcher`        notify (queue) and step (deliver, retry, re-alert)
* :mod:`.channels`, :mod:`.setup`  building all of it from the config
"""
