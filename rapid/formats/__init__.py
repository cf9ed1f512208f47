"""The stored object formats: msgpack with raw numpy arrays, a name, a version and a checksum.

They encode and decode only; where objects live is :mod:`rapid.run.store_map`.
"""
