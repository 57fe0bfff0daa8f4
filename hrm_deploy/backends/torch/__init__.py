"""PyTorch AOTInductor engines (``.pt2``): built from a checkpoint (:mod:`.builder`) and run
through the shared device loop (:mod:`.runner`) on torch or host memory."""
