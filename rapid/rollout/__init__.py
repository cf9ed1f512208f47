"""The rollout side: what a rollout worker runs. Its games and the decisions it records (``worker``, ``decisions``),
where its policy runs (``inference``: on its own core, or on the node's server: ``inference_client``,
``inference_wire``, ``inference_server``, ``inference_batch``), its league opponents (``opponents``), the node's
shared cache of what it reads (``node_cache``) and where it uploads experience (``uploader``). It never imports
the optimizer side (``tests/test_layout.py``)."""
