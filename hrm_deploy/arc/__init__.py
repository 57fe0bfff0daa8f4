"""ARC: upstream's augmented-voting metric (``score``) and end-to-end evaluation of any artifact
(``evaluate``). The grid format and augmentations live with the datasets (``data.arc_grids``)."""
