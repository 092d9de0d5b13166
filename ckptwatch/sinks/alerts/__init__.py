"""Alert delivery (issue 4, in progress): shared stages first, one module per channel later.

* :mod:`.redact`     secrets removed from log lines before they leave the machine
* :mod:`.pagerduty`  Events API v2 trigger / resolve payloads
* :mod:`.slack`      Block Kit message within Slack's limits

Not yet here: senders, the alert log (dedup), outbox and retries, routing, silences.
"""
