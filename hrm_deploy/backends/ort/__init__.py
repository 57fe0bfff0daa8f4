"""ONNX Runtime: runs ``.onnx`` graphs (:mod:`.runner`) and builds the ``cpu`` target's graphs
(:mod:`.builder`: operator fusions, dynamic and static INT8 recipes)."""
