"""PyTorch AOTInductor engines (``.pt2``), built from a checkpoint and run through the shared device loop.

- :mod:`.builder`: ``build-engine --backend torch``: its options (device, TF32), and the single step,
  the unroll or the ACT loop (a ``torch.while_loop``) exported and compiled into a package, its
  fresh-process load checked (preflight, build, publish);
- :mod:`.runner`: the runner (an adapter into the device loop, torch or host memory);
- :mod:`.package`: loading a package through torch's C++ loader (the call spec parsed once), the
  per-process extraction folder;
- :mod:`.probe`: the load probe (a child process loads the package first; sealed, cached verdicts);
- :mod:`.fallback`: the exported program run when a package cannot be loaded (eager first, compiled
  once the work pays for it);
- :mod:`.host`: the host facts a probe verdict is keyed on (CPU model and flags, permission mask, driver).
"""
