"""Detectors: events -> incidents, per job, in event time.

* :mod:`.events`      the detectors' view of an event (no polars, no Kafka)
* :mod:`.jobstate`    what is known of one job: rank/pid/host maps, world size, its events
* :mod:`.saves`       the save lifecycle per step and rank
* :mod:`.cause`       root cause: the initiating failure vs downstream reports
* :mod:`.save_incidents`  interrupted / partial / storage-failure / stalled saves
* :mod:`.incident`    the Incident contract and its deterministic id
* :mod:`.runner`      routes events to jobs, keeps the watermark, emits changed incidents
"""

from ckptwatch.detectors.incident import Incident
from ckptwatch.detectors.runner import Detector, DetectorConfig

__all__ = ["Detector", "DetectorConfig", "Incident"]
