"""ARC: upstream's augmented-voting metric (``score``), the dataset builder's grid format
(``grids``) and end-to-end evaluation of any artifact (``evaluate``)."""
