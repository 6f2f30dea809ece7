"""The RocketMQ record format, shared by every layer (FORMATS §1).

The hot store writes it, the tiering engine copies it into flat files, the cold read path and
Spark decode it. It is a leaf: modules here import only :mod:`tierd.errors`, each other, the
standard library and numpy-level libraries — never a layer above (``tests/test_layers.py``).

One concept per module:

* :mod:`~tierd.format.record` — one commitlog record: layout, encode, decode, scan, body CRC.
* :mod:`~tierd.format.batch` — many records at once with numpy (``put_batch``, cold reads).
* :mod:`~tierd.format.message_ext` — :class:`MessageExt`, what decoding a record yields.
* :mod:`~tierd.format.properties` — the PROPERTIES field and the property names it carries.
* :mod:`~tierd.format.host` — BORNHOST/STOREHOST encoding (``ip:port``).
* :mod:`~tierd.format.message_id` — the offset message id (STOREHOST + PHYSICALOFFSET).
* :mod:`~tierd.format.cq_unit` — the 20-byte consume-queue unit and its tags code.
* :mod:`~tierd.format.key_hash` — the key index's ``topic#key`` string and its hash.

Nothing is re-exported here: importing the package loads nothing but this docstring.
"""
